"""`bench learn` outputs: results.json, results.md (Markdown tables) and the curve plots, and
`bench learn report RESULTS_JSON… [page=FILE]`, which redraws them from a results.json alone.

results.md holds the tables that a page can quote (BLOCKS): `headline` (per task and method: final
eval return, last training return, time to threshold, wall-clock), `wall-marks` (the return at
each wall-clock mark of a wall-clock budget), `health` (value-support and action saturation, α and
entropy), `lora-vs-dense` (each LoRA family against its dense twin) and `tables` (every number per
task). A page embeds them between
`<!-- BEGIN GENERATED: SUITE BLOCK -->` and `<!-- END GENERATED -->` lines, which `page=FILE`
rewrites in place; tests/test_bench_report.py checks docs/RESULTS.md against the committed
docs/results/*/results.json.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fast_lora_td3.bench.plots import write_plots
from fast_lora_td3.bench.stats import summarize
from fast_lora_td3.errors import ConfigError

MARKER = re.compile(
    r"^<!-- BEGIN GENERATED: (?P<suite>\S+) (?P<block>\S+) -->\n(?P<body>.*?)^<!-- END GENERATED -->$",
    re.DOTALL | re.MULTILINE,
)
"""A generated block of a page: its suite, its block name and the text between the lines."""


def _fmt(stat: dict[str, Any] | None, digits: int = 4) -> str:
    """`mean [lo, hi]` of a summarize() dict, `–` when missing."""
    if not stat or stat.get("mean") is None:
        return "–"
    text = f"{stat['mean']:.{digits}g}"
    ci = stat.get("ci95")
    if ci and stat.get("n", 0) > 1:
        text += f" [{ci[0]:.{digits}g}, {ci[1]:.{digits}g}]"
    return text


def _num(x: float) -> str:
    """A page number: whole with thousands separators from 100 up, else 3 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ci(stat: dict[str, Any] | None) -> str:
    """`mean [lo, hi]` in page numbers (no interval for one value), `–` when missing."""
    if not stat or stat.get("mean") is None:
        return "–"
    ci = stat.get("ci95")
    bracket = f" [{_num(ci[0])}, {_num(ci[1])}]" if ci and stat.get("n", 0) > 1 else ""
    return _num(stat["mean"]) + bracket


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(cells: list[str]) -> list[str]:
    return [_row(cells), "|" + "---|" * len(cells)]


def headline(results: dict[str, Any]) -> str:
    """Per task and method: seeds, final eval return, last training return, env steps / wall s
    to the threshold (runs that reached it) and wall-clock s per run."""
    lines = _head(
        [
            "task (env steps)",
            "method",
            "seeds",
            "final eval return",
            "last training return",
            "to threshold: env steps / wall s (runs)",
            "wall-clock s per run",
        ]
    )
    for name, task in results["tasks"].items():
        spec = task["spec"]
        budget = f"{spec['wall_s']:g} s" if spec.get("wall_s") else f"{spec['total_steps']:,}"
        label = f"{name} ({budget}; threshold {spec['threshold']:g})"
        for method, data in task["methods"].items():
            s = data["summary"]
            reach = f"{_ci(s['steps_to_threshold'])} / {_ci(s['seconds_to_threshold'])}"
            reach += f" ({s['reached_threshold']}/{s['seeds']})"
            cells = [label, method, str(s["seeds"]), _ci(s["final_eval_return"])]
            cells += [_ci(s["final_train_return"]), reach, _ci(s["wall_time_s"])]
            lines.append(_row(cells))
    return "\n".join(lines) + "\n"


def wall_marks(results: dict[str, Any]) -> str:
    """Tasks with a wall-clock budget: per method, the training return at each wall-clock mark,
    the final eval return and the env steps the budget bought."""
    specs = [t["spec"] for t in results["tasks"].values()]
    marks = sorted({f"{m:g}" for spec in specs for m in spec.get("wall_marks") or ()}, key=float)
    if not marks:
        return "(no task of this suite has a wall-clock budget)\n"
    head = ["task", "method", "seeds", *[f"return @ {m} s" for m in marks]]
    lines = _head([*head, "final eval return", "env steps in the budget"])
    for name, task in results["tasks"].items():
        if not task["spec"].get("wall_marks"):
            continue
        for method, data in task["methods"].items():
            s = data["summary"]
            cells = [name, method, str(s["seeds"])]
            cells += [_ci(s["wall_returns"].get(m)) for m in marks]
            env_steps = summarize([r.get("env_steps") for r in data["runs"]])
            lines.append(_row([*cells, _ci(s["final_eval_return"]), _ci(env_steps)]))
    return "\n".join(lines) + "\n"


def _peak(runs: list[dict[str, Any]], key: str) -> str:
    """The highest per-run value of a share, `–` when no run has it."""
    worst = max((r[key] for r in runs if r.get(key) is not None), default=None)
    return "–" if worst is None else f"{worst:.2f}"


def health(results: dict[str, Any]) -> str:
    """Per task and our method: the critic's end-atom mass (peak over rows, the worst run) and
    share of saturated rows, the actor's saturated actions, and α and entropy against its target
    (FastSAC). A run whose critic saturates shows peak mass near 1 and saturated rows > 0."""
    lines = _head(
        [
            "task",
            "method",
            "seeds",
            "peak end-atom mass (worst run)",
            "rows over 0.1 (worst run)",
            "saturated actions, last row",
            "α, last row",
            "entropy / target, last row",
        ]
    )
    for name, task in results["tasks"].items():
        for method, data in task["methods"].items():
            runs = data["runs"]
            if all(r.get("end_mass_max") is None for r in runs):
                continue  # a peer: no value support
            s = data["summary"]
            entropy = "–"
            if s.get("entropy", {}).get("mean") is not None:
                entropy = f"{_ci(s['entropy'])} / {_ci(s['entropy_target'])}"
            cells = [name, method, str(s["seeds"]), _peak(runs, "end_mass_max")]
            cells += [_peak(runs, "saturated_rows"), _ci(s.get("saturated_actions"))]
            cells += [_ci(s.get("alpha")), entropy]
            lines.append(_row(cells))
    return "\n".join(lines) + "\n"


def _verdict(ci: list[float] | None) -> str:
    if ci is None:
        return "–"
    what = (
        "LoRA higher" if ci[0] > 0 else "dense higher" if ci[1] < 0 else "no significant difference"
    )
    return f"[{_num(ci[0])}, {_num(ci[1])}]: {what}"


def lora_vs_dense(results: dict[str, Any]) -> str:
    """Each LoRA family against the dense family of the same width: returns with the difference
    CI, critic loss, relative weight change and the adapters' norm."""
    lines = _head(
        [
            "task",
            "LoRA − dense",
            "seeds",
            "final eval return: LoRA / dense",
            "difference CI",
            "AUC: LoRA / dense",
            "difference CI",
            "critic loss: LoRA / dense",
            "‖W−W₀‖/‖W₀‖: LoRA / dense",
            "‖ΔW_LoRA‖",
        ]
    )
    for name, task in results["tasks"].items():
        for pair, comp in task["lora_vs_dense"].items():
            lora, dense = pair.split("-")
            a, b = task["methods"][lora]["summary"], task["methods"][dense]["summary"]
            cells = [name, pair, f"{a['seeds']} / {b['seeds']}"]
            for key in ("final_eval_return", "auc_return"):
                cells += [f"{_ci(a[key])} / {_ci(b[key])}", _verdict(comp[f"{key}_diff_ci95"])]
            for key in ("final_critic_loss", "weight_change_rel"):
                cells.append(f"{_ci(a[key])} / {_ci(b[key])}")
            cells.append(_ci(a["adapter_delta_norm"]))
            lines.append(_row(cells))
    return "\n".join(lines) + "\n"


def _budget(spec: dict[str, Any]) -> str:
    """A task's budget in words: env steps, or wall-clock seconds per run when it has one."""
    if spec.get("wall_s"):
        return f"{spec['wall_s']:g} s per run on one core"
    return f"{spec['total_steps']:,} env steps"


def full_tables(results: dict[str, Any]) -> str:
    """Per task, every method's returns, speed, critic loss, weight change and adapter norms."""
    lines = []
    for name, task in results["tasks"].items():
        spec = task["spec"]
        cps = [str(c) for c in spec["checkpoints"]]
        lines += [
            f"### {name} ({_budget(spec)}, threshold {spec['threshold']:g})",
            "",
        ]
        marks = [f"{m:g}" for m in spec.get("wall_marks") or ()]
        head = ["method", "seeds", "final return", "AUC", *[f"@{c}" for c in cps]]
        head += [f"@{m} s" for m in marks]
        head += ["to threshold (steps / s)", "wall-clock s", "critic loss", "‖ΔW‖ rel", "‖ΔW_LoRA‖"]
        lines += _head(head)
        for method, data in task["methods"].items():
            s = data["summary"]
            reached = f"{s['reached_threshold']}/{s['seeds']}"
            ttt = (
                f"{_fmt(s['steps_to_threshold'], 3)} / {_fmt(s['seconds_to_threshold'], 3)} "
                f"({reached})"
            )
            cells = [method, str(s["seeds"]), _fmt(s["final_eval_return"]), _fmt(s["auc_return"])]
            cells += [_fmt(s["checkpoint_returns"][c]) for c in cps]
            cells += [_fmt(s.get("wall_returns", {}).get(m)) for m in marks]
            cells += [ttt, _fmt(s["wall_time_s"], 3), _fmt(s["final_critic_loss"], 3)]
            cells += [_fmt(s["weight_change_rel"], 3), _fmt(s["adapter_delta_norm"], 3)]
            lines.append(_row(cells))
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
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "headline": headline,
    "wall-marks": wall_marks,
    "health": health,
    "lora-vs-dense": lora_vs_dense,
    "tables": full_tables,
}
"""The tables a page can embed, by the block name of its marker lines."""


def markdown(results: dict[str, Any]) -> str:
    """results.md: where the numbers come from, then the BLOCKS tables."""
    suite = results["suite"]
    lines = [f"# bench learn: `{suite}` suite", ""]
    if results.get("note"):
        lines += [results["note"], ""]
    if results.get("command"):
        commit = results.get("commit") or "unknown"
        lines += [f"Produced by `{results['command']}` at commit `{commit}`.", ""]
    runs = [r for t in results["tasks"].values() for m in t["methods"].values() for r in m["runs"]]
    by_commit = Counter(run.get("commit") or "unrecorded" for run in runs)
    if any(run.get("commit") for run in runs):
        made = ", ".join(f"`{c}` ({n} runs)" for c, n in by_commit.items())
        lines += [f"Runs executed by: {made}.", ""]
    lines += [
        f"Mean over seeds with the 95 % bootstrap CI in brackets. Final return: deterministic "
        "evaluation at the end; AUC: mean training-episode return over the run; @N: training "
        "return at N env steps; to threshold: env steps / wall seconds of the first logged return "
        "at or above the task's threshold (runs that reached it / seeds). A page quotes a table "
        f"between `<!-- BEGIN GENERATED: {suite} BLOCK -->` and `<!-- END GENERATED -->` lines "
        f"(BLOCK one of {', '.join(BLOCKS)}).",
        "",
    ]
    titles = (
        "Headline",
        "Return at wall-clock marks",
        "Health: saturation and entropy",
        "LoRA vs dense at the same width",
        "Full tables",
    )
    for title, (block, make) in zip(titles, BLOCKS.items(), strict=True):
        lines += [f"## {title} (`{block}`)", "", make(results)]
    return "\n".join(lines).rstrip("\n") + "\n"


def rewrite_page(text: str, results: dict[str, Any]) -> tuple[str, int]:
    """`text` with the suite's generated blocks redrawn from `results`, and how many there were."""
    suite, count = results["suite"], 0

    def redraw(m: re.Match[str]) -> str:
        nonlocal count
        if "<!-- BEGIN GENERATED" in m["body"]:
            raise ConfigError(
                f"bench learn report: the {m['suite']} {m['block']} block has no "
                "`<!-- END GENERATED -->` line before the next BEGIN: add it"
            )
        if m["suite"] != suite:
            return m[0]
        if m["block"] not in BLOCKS:
            raise ConfigError(
                f"bench learn report: unknown block {m['block']!r} in a GENERATED marker: "
                f"use one of {', '.join(BLOCKS)}"
            )
        count += 1
        body = BLOCKS[m["block"]](results).rstrip("\n") + "\n"
        return f"<!-- BEGIN GENERATED: {suite} {m['block']} -->\n{body}<!-- END GENERATED -->"

    return MARKER.sub(redraw, text), count


def page_blocks(text: str) -> dict[tuple[str, str], str]:
    """(suite, block) → the text between the marker lines, for every generated block of a page."""
    return {(m["suite"], m["block"]): m["body"] for m in MARKER.finditer(text)}


def dumps(results: dict[str, Any]) -> str:
    """results.json text: indented, with every list of numbers (a curve point, a CI) and every
    list of such lists (a curve) on one line, so that ~50 runs' curves stay ~0.5 MB."""
    text = json.dumps(results, indent=1)
    flat = r"\[[^\[\]{}\"]*\]"
    text = re.sub(flat, lambda m: re.sub(r"\s+", "", m[0]), text)
    nested = rf"\[\s*{flat}(?:\s*,\s*{flat})*\s*\]"
    return re.sub(nested, lambda m: re.sub(r"\s+", "", m[0]), text) + "\n"


def write_report(results: dict[str, Any], out: Path) -> None:
    """results.json, results.md and the plots under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(dumps(results))
    (out / "results.md").write_text(markdown(results))
    write_plots(results, out)


def load_results(path: Path) -> dict[str, Any]:
    """A results.json written by `bench learn` (with its runs' curves)."""
    if not path.is_file():
        raise ConfigError(f"bench learn report: no file {path}: give a results.json path")
    try:
        results = json.loads(path.read_text())
        runs = [
            r for t in results["tasks"].values() for m in t["methods"].values() for r in m["runs"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"bench learn report: {path} is not a bench learn results.json") from None
    if not all("curves" in r for r in runs):
        raise ConfigError(
            f"bench learn report: {path} has no run curves (written before results.json kept "
            "them): rerun its `bench learn SUITE out=…` (finished runs are skipped, not rerun)"
        )
    return results


def run_report(args: list[str]) -> int:
    """`bench learn report RESULTS_JSON… [page=FILE]`: results.md and the plots next to each JSON,
    and each suite's generated blocks of FILE rewritten. Everything is read and checked before
    anything is written."""
    first_option = next((i for i, word in enumerate(args) if "=" in word), len(args))
    paths = [Path(word) for word in args[:first_option]]
    if not paths:
        raise ConfigError(
            "bench learn report: give a results.json path (one per suite) first, then page=FILE"
        )
    page = None
    for word in args[first_option:]:
        key, eq, value = word.partition("=")
        if key != "page" or not eq or not value:
            raise ConfigError(
                f"bench learn report: bad argument {word!r}: the one option is page=FILE"
            )
        page = Path(value)
    every = [load_results(path) for path in paths]
    suites = [results["suite"] for results in every]
    if len(set(suites)) < len(suites):
        raise ConfigError(
            f"bench learn report: two results.json files of one suite ({', '.join(suites)}): "
            "give one per suite"
        )
    if page is not None:
        if not page.is_file():
            raise ConfigError(
                f"bench learn report: no file page={page}: give the Markdown page to rewrite"
            )
        text, rewritten = page.read_text(), 0
        for results in every:
            text, count = rewrite_page(text, results)
            if not count:
                raise ConfigError(
                    f"bench learn report: page={page} has no `<!-- BEGIN GENERATED: "
                    f"{results['suite']} BLOCK -->` lines: add them where the tables go"
                )
            rewritten += count
    for path, results in zip(paths, every, strict=True):
        out = path.parent
        (out / "results.md").write_text(markdown(results))
        drawn = write_plots(results, out)
        print(f"wrote {out / 'results.md'} and {len(drawn)} plots", flush=True)
    if page is not None:
        page.write_text(text)
        print(f"rewrote {rewritten} generated block(s) of {page}", flush=True)
    return 0
