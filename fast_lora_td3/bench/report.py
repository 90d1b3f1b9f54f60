"""`bench learn` outputs: results.json, results.md (Markdown tables) and the curve plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fast_lora_td3.bench import stats as bench_stats


def _fmt(stat: dict[str, Any] | None, digits: int = 4) -> str:
    """`mean [lo, hi]` of a summarize() dict, `–` when missing."""
    if not stat or stat.get("mean") is None:
        return "–"
    text = f"{stat['mean']:.{digits}g}"
    ci = stat.get("ci95")
    if ci and stat.get("n", 0) > 1:
        text += f" [{ci[0]:.{digits}g}, {ci[1]:.{digits}g}]"
    return text


def markdown(results: dict[str, Any]) -> str:
    """The Markdown tables: per task, every method's returns, speed, critic loss, weight change
    and adapter norms."""
    lines = [f"# bench learn: `{results['suite']}` suite", ""]
    if results.get("note"):
        lines += [results["note"], ""]
    lines += [
        "Mean over seeds with the 95 % bootstrap CI in brackets. Final return: deterministic "
        "evaluation at the end; AUC: mean training-episode return over the run; @N: training "
        "return at N env steps; to threshold: env steps / wall seconds of the first logged return "
        "at or above the task's threshold (runs that reached it / seeds).",
        "",
    ]
    for name, task in results["tasks"].items():
        spec = task["spec"]
        cps = [str(c) for c in spec["checkpoints"]]
        lines += [
            f"## {name} ({spec['total_steps']:,} env steps, threshold {spec['threshold']:g})",
            "",
        ]
        head = ["method", "seeds", "final return", "AUC", *[f"@{c}" for c in cps]]
        head += ["to threshold (steps / s)", "wall-clock s", "critic loss", "‖ΔW‖ rel", "‖ΔW_LoRA‖"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for method, data in task["methods"].items():
            s = data["summary"]
            reached = f"{s['reached_threshold']}/{s['seeds']}"
            ttt = (
                f"{_fmt(s['steps_to_threshold'], 3)} / {_fmt(s['seconds_to_threshold'], 3)} "
                f"({reached})"
            )
            cells = [method, str(s["seeds"]), _fmt(s["final_eval_return"]), _fmt(s["auc_return"])]
            cells += [_fmt(s["checkpoint_returns"][c]) for c in cps]
            cells += [ttt, _fmt(s["wall_time_s"], 3), _fmt(s["final_critic_loss"], 3)]
            cells += [_fmt(s["weight_change_rel"], 3), _fmt(s["adapter_delta_norm"], 3)]
            lines.append("| " + " | ".join(cells) + " |")
        for pair, comp in task["lora_vs_dense"].items():
            for key, what in (("final_eval_return", "final-return"), ("auc_return", "AUC")):
                ci = comp.get(f"{key}_diff_ci95")
                if ci is None:
                    continue
                verdict = "no significant difference" if ci[0] <= 0 <= ci[1] else "significant"
                lines.append(
                    f"\n{pair}: {what} difference 95 % CI [{ci[0]:.4g}, {ci[1]:.4g}] ({verdict})"
                )
        lines.append("")
    return "\n".join(lines) + "\n"


PLOTS = {
    # file name: (metric key, x axis (0: env steps, 1: wall-clock s), y label, methods)
    "curves_env_steps.png": ("episode_return", 0, "training episode return", "all"),
    "curves_wall_clock.png": ("episode_return", 1, "training episode return", "all"),
    "curves_episode_length.png": ("episode_length", 0, "training episode length", "all"),
    "critic_loss.png": ("critic_loss", 0, "critic loss (ours)", "critics"),
    "weight_change.png": ("critic/weight_change_rel", 0, "critic ‖W−W0‖/‖W0‖", "critics"),
}
"""The figures write_report draws; `critics` keeps our critic families (peers lack the metric)."""


def plot(
    results: dict[str, Any],
    path: Path,
    axis: int,
    key: str = "episode_return",
    ylabel: str = "training episode return",
    methods: str = "all",
) -> None:
    """`key` vs env steps (axis 0) or vs wall-clock seconds (axis 1), one panel per task (tasks
    with fewer than two plotted methods are left out when `methods` is `critics`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = ("ppo", "sb3_td3", "sb3_sac")
    tasks = {
        name: task
        for name, task in results["tasks"].items()
        if methods == "all" or sum(m not in peers for m in task["methods"]) >= 2
    }
    if not tasks:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, (name, task) in zip(axes[0], tasks.items(), strict=True):
        for method, data in task["methods"].items():
            if methods == "critics" and method in peers:
                continue
            curves = []
            for run in data["runs"]:
                rows = bench_stats.read_rows(Path(run["run_dir"]) / "metrics.jsonl")
                curves.append(bench_stats.curve(rows, key))
            grid, mean, lo, hi = bench_stats.mean_curve(curves, axis)
            if len(grid) == 0:
                continue
            (line,) = ax.plot(grid, mean, label=method, lw=1.2)
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("env steps" if axis == 0 else "wall-clock s")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(results: dict[str, Any], out: Path) -> None:
    """results.json, results.md and the PLOTS figures under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    for name, (key, axis, ylabel, methods) in PLOTS.items():
        plot(results, out / name, axis, key, ylabel, methods)
