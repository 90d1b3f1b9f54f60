"""Learning curves of several runs side by side, from their metrics.jsonl (`fast-lora-td3 plot`).

Uses matplotlib's object API with the Agg canvas directly, so it never touches pyplot's global
backend (safe in a notebook or a headless node).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from fast_lora_td3.errors import ConfigError

DEFAULT_KEYS = ("episode_return", "eval_return", "critic_loss")
PANEL_SIZE_IN = (5.0, 4.0)
"""Width and height of one subplot in inches (at DPI: 500 x 400 pixels)."""
DPI = 100


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The rows of `<run_dir>/metrics.jsonl` (or of that file itself); unreadable lines are skipped.

    A line cut short by a killed run must not stop the plot, so bad lines are ignored.
    """
    path = Path(run_dir)
    file = path if path.is_file() else path / "metrics.jsonl"
    if not file.is_file():
        raise ConfigError(
            f"no metrics.jsonl in {path}: plot expects run directories written by "
            "`fast-lora-td3 train`"
        )
    rows = []
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("env_steps"), int | float):
            rows.append(row)
    return rows


def series(rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(env_steps, values) of `key`, sorted by step; null / non-finite values are dropped, and of
    rows repeating a step (a resumed run) the last one wins."""
    by_step: dict[float, float] = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            by_step[row["env_steps"]] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [p.name if p.is_dir() else p.parent.name for p in run_dirs]
    if len(set(names)) == len(names):
        return names
    # Same timestamped name under different tasks: add the task folder to tell them apart.
    return [
        f"{p.parent.name}/{p.name}" if p.is_dir() else f"{p.parent.parent.name}/{p.parent.name}"
        for p in run_dirs
    ]


def plot_runs(
    run_dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    keys: Sequence[str] = DEFAULT_KEYS,
) -> Path:
    """Write a PNG with one subplot per key (x = env_steps) and one line per run; returns `out`.

    Keys no run has are skipped; ConfigError if a run has no metrics.jsonl or no key has data.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not run_dirs:
        raise ConfigError("plot needs at least one run directory")
    paths = [Path(p) for p in run_dirs]
    runs = [read_metrics(p) for p in paths]
    labels = _labels(paths)
    present = [k for k in keys if any(series(rows, k)[0] for rows in runs)]
    if not present:
        found = sorted({k for rows in runs for row in rows for k in row} - {"env_steps"})
        raise ConfigError(
            f"none of the keys {', '.join(keys)} has data in these runs; available keys: "
            f"{', '.join(found) or 'none'}"
        )
    fig = Figure(figsize=(PANEL_SIZE_IN[0] * len(present), PANEL_SIZE_IN[1]), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    for ax, key in zip(axes, present, strict=True):
        for i, (rows, label) in enumerate(zip(runs, labels, strict=True)):
            steps, values = series(rows, key)
            if steps:  # a run keeps its colour in every panel, even where others are missing
                marker = "." if len(steps) < 20 else None
                ax.plot(steps, values, label=label, color=f"C{i % 10}", marker=marker)
        ax.set_title(key)
        positive = all(v > 0 for rows in runs for v in series(rows, key)[1])
        if key.endswith("loss") and positive:
            ax.set_yscale("log")  # losses fall by orders of magnitude
        ax.set_xlabel("env steps")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()  # keeps the canvas size (unlike bbox_inches="tight")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=DPI)
    return out
