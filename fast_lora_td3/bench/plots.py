"""The curve figures of a `bench learn` suite, drawn from results.json alone.

`collect` stores each run's curves (the PLOTS metrics against env steps and wall-clock seconds) in
results.json, shrunk to at most CURVE_POINTS points each, so that committed results regenerate the
figures without the run directories.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fast_lora_td3.bench import stats as bench_stats

PLOTS = {
    # file name: (metric key, x axis (0: env steps, 1: wall-clock s), y label, methods)
    "curves_env_steps.png": ("episode_return", 0, "training episode return", "all"),
    "curves_wall_clock.png": ("episode_return", 1, "training episode return", "all"),
    "curves_episode_length.png": ("episode_length", 0, "training episode length", "all"),
    "critic_loss.png": ("critic_loss", 0, "critic loss (ours)", "critics"),
    "weight_change.png": ("critic/weight_change_rel", 0, "critic ‖W−W0‖/‖W0‖", "critics"),
}
"""The figures write_plots draws; `critics` keeps our critic families (peers lack the metric)."""
CURVE_KEYS = tuple(dict.fromkeys(key for key, *_ in PLOTS.values()))
"""metrics.jsonl keys whose curves results.json keeps per run."""
CURVE_POINTS = 100
"""Points kept per curve: 2.5 per point of the plots' 40-point grid; ~50 runs stay ~0.5 MB."""
PEERS = ("ppo", "sb3_td3", "sb3_sac")


def shrink(points: np.ndarray, num: int = CURVE_POINTS) -> list[list[float]]:
    """A [K, 3] (env steps, wall s, value) curve as at most `num` rows: beyond `num` points, the
    means of `num` consecutive runs of points (every point counts, both axes stay increasing);
    rounded to whole env steps, centiseconds and 4 significant digits to keep the JSON small."""
    if len(points) > num:
        points = np.stack([chunk.mean(axis=0) for chunk in np.array_split(points, num)])
    return [[round(float(s)), round(float(t), 2), float(f"{v:.4g}")] for s, t, v in points]


def run_curves(rows: Sequence[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """The CURVE_KEYS curves of one run's metrics rows (keys the run never logged are left out)."""
    curves = {key: bench_stats.curve(rows, key) for key in CURVE_KEYS}
    return {key: shrink(points) for key, points in curves.items() if len(points)}


def plot(
    results: dict[str, Any],
    path: Path,
    axis: int,
    key: str = "episode_return",
    ylabel: str = "training episode return",
    methods: str = "all",
) -> bool:
    """`key` vs env steps (axis 0) or vs wall-clock seconds (axis 1) from the runs' stored curves,
    one panel per task (tasks with fewer than two plotted methods are left out when `methods` is
    `critics`); False, and no file, when no task qualifies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = {
        name: task
        for name, task in results["tasks"].items()
        if methods == "all" or sum(m not in PEERS for m in task["methods"]) >= 2
    }
    if not tasks:
        return False
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, (name, task) in zip(axes[0], tasks.items(), strict=True):
        for method, data in task["methods"].items():
            if methods == "critics" and method in PEERS:
                continue
            curves = [
                np.asarray(run["curves"].get(key, []), dtype=np.float64).reshape(-1, 3)
                for run in data["runs"]
            ]
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
    return True


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """The PLOTS figures under `out`; returns the files drawn."""
    drawn = []
    for name, (key, axis, ylabel, methods) in PLOTS.items():
        if plot(results, out / name, axis, key, ylabel, methods):
            drawn.append(out / name)
    return drawn
