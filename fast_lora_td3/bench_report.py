"""`bench learn` outputs: results.json, results.md (Markdown tables) and the curve plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fast_lora_td3 import bench_stats


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
    """The Markdown tables: per task, every method's returns, speed and §4 metrics."""
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
            ci = comp["final_eval_return_diff_ci95"]
            if ci is None:
                continue
            verdict = "no significant difference" if ci[0] <= 0 <= ci[1] else "significant"
            lines.append(
                f"\n{pair}: final-return difference 95 % CI [{ci[0]:.4g}, {ci[1]:.4g}] ({verdict})"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path, axis: int) -> None:
    """Return vs env steps (axis 0) or vs wall-clock seconds (axis 1), one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, (name, task) in zip(axes[0], tasks.items(), strict=True):
        for method, data in task["methods"].items():
            curves = []
            for run in data["runs"]:
                rows = bench_stats.read_rows(Path(run["run_dir"]) / "metrics.jsonl")
                curves.append(bench_stats.curve(rows))
            grid, mean, lo, hi = bench_stats.mean_curve(curves, axis)
            if len(grid) == 0:
                continue
            (line,) = ax.plot(grid, mean, label=method, lw=1.2)
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("env steps" if axis == 0 else "wall-clock s")
        ax.set_ylabel("training episode return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(results: dict[str, Any], out: Path) -> None:
    """results.json, results.md, curves_env_steps.png and curves_wall_clock.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    plot(results, out / "curves_env_steps.png", axis=0)
    plot(results, out / "curves_wall_clock.png", axis=1)
