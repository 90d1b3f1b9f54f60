"""Aggregation of learning runs for `fast-lora-td3 bench learn`: curves, checkpoints, bootstrap CIs.

A run is its metrics.jsonl. Its learning curve is the rows that carry `episode_return` (training
episodes, logged by every method: ours, PPO, the SB3 peers). Definitions (all tested by hand):

* return at checkpoint c (env steps): linear interpolation of the curve between the rows around c;
  after the curve's last point, the last logged return if the run got to c (no episode ended
  since); None before the first episode or beyond the run.
* AUC return: the trapezoid area under return vs env steps divided by the steps it spans, i.e. the
  curve's mean return over training (comparable across budgets, in return units).
* time to threshold: env steps and wall-clock seconds of the first row whose return ≥ threshold.
* health (ours): the peak share of target mass on an end atom of the value support over the run's
  rows, the share of rows above END_MASS_SATURATED (the training warning's threshold), and the last
  row's share of saturated actions, α, policy entropy and entropy target (FastSAC).
* 95 % bootstrap CI of a mean over seeds: percentile interval (inverted-CDF quantiles 2.5 % and
  97.5 %) of the resampled means. With n ≤ 6 seeds all nⁿ resamples are enumerated (exact, no RNG);
  beyond that 10,000 resamples from a fixed-seed generator.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

CI_LEVEL = 0.95
EXACT_MAX_N = 6
"""Enumerate every resample up to this many seeds (6⁶ = 46,656 resamples)."""
MC_RESAMPLES = 10_000
END_MASS_SATURATED = 0.1
"""End-atom mass share above which a row counts as saturated (training's ValueRangeWatch warns
after three such rows in a row)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (a partial last line from a killed run is skipped)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def curve(rows: Sequence[dict[str, Any]], key: str = "episode_return") -> np.ndarray:
    """[K, 3] array of (env_steps, wall_time_s, value) of the rows where `key` is a number."""
    pts = [
        (float(r["env_steps"]), float(r.get("wall_time_s") or 0.0), float(r[key]))
        for r in rows
        if isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]
    return np.asarray(pts, dtype=np.float64).reshape(-1, 3)


def value_at(points: np.ndarray, x: float, axis: int = 0) -> float | None:
    """The curve's value at `x` on column `axis` (0: env steps, 1: wall-clock), linearly
    interpolated; None outside the curve's range."""
    if len(points) == 0 or x < points[0, axis] or x > points[-1, axis]:
        return None
    return float(np.interp(x, points[:, axis], points[:, 2]))


def checkpoint_return(
    points: np.ndarray, steps: float, run_end: float, axis: int = 0
) -> float | None:
    """Return at `steps` env steps (axis 0; wall-clock seconds with axis 1): interpolated on the
    curve; between the curve's last point and the run's last row (`run_end`) the last logged
    return (no episode ended since); else None."""
    inside = value_at(points, steps, axis)
    if inside is not None or len(points) == 0:
        return inside
    return float(points[-1, 2]) if points[-1, axis] < steps <= run_end else None


def auc_return(points: np.ndarray) -> float | None:
    """Mean return over the curve's env-step span (trapezoid area / span); a lone point: its value."""
    if len(points) == 0:
        return None
    span = points[-1, 0] - points[0, 0]
    if span <= 0:
        return float(points[:, 2].mean())
    area = float(np.sum(np.diff(points[:, 0]) * (points[1:, 2] + points[:-1, 2]) / 2.0))
    return area / span


def time_to_threshold(points: np.ndarray, threshold: float) -> tuple[float, float] | None:
    """(env steps, wall seconds) of the first point with return ≥ threshold; None if never."""
    hits = np.nonzero(points[:, 2] >= threshold)[0] if len(points) else []
    if len(hits) == 0:
        return None
    first = points[hits[0]]
    return float(first[0]), float(first[1])


def _resample_means(values: np.ndarray) -> np.ndarray:
    n = len(values)
    if n <= EXACT_MAX_N:
        idx = np.array(list(itertools.product(range(n), repeat=n)))
    else:
        idx = np.random.default_rng(0).integers(0, n, size=(MC_RESAMPLES, n))
    return values[idx].mean(axis=1)


def bootstrap_ci(values: Sequence[float]) -> tuple[float, float] | None:
    """95 % percentile bootstrap CI of the mean of `values` (None when empty)."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if len(v) == 0:
        return None
    means = _resample_means(v)
    lo, hi = np.quantile(means, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """95 % bootstrap CI of mean(a) − mean(b), the two groups resampled independently (None
    unless each group has two values: one seed has no spread to resample, so its CI would be
    falsely narrow)."""
    va, vb = (np.asarray([x for x in s if x is not None], dtype=np.float64) for s in (a, b))
    if len(va) < 2 or len(vb) < 2:
        return None
    ma, mb = _resample_means(va), _resample_means(vb)
    rng = np.random.default_rng(1)  # pair the two bootstrap distributions at random
    diffs = rng.choice(ma, MC_RESAMPLES) - rng.choice(mb, MC_RESAMPLES)
    lo, hi = np.quantile(diffs, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def summarize(values: Sequence[float | None]) -> dict[str, Any]:
    """{"mean", "ci95": [lo, hi], "n"} over the non-missing values (mean None when none)."""
    v = [float(x) for x in values if x is not None]
    ci = bootstrap_ci(v)
    return {"mean": float(np.mean(v)) if v else None, "ci95": list(ci) if ci else None, "n": len(v)}


def health_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Whether the run's critic saturated its value support and its actor its action bounds, and
    (FastSAC) where α and the policy entropy ended; None for what the run never logged."""
    mass = [
        max(r["value/end_mass_low"], r["value/end_mass_high"])
        for r in rows
        if isinstance(r.get("value/end_mass_low"), int | float)
        and isinstance(r.get("value/end_mass_high"), int | float)
    ]

    def last(key: str) -> float | None:
        return next(
            (float(r[key]) for r in reversed(rows) if isinstance(r.get(key), int | float)), None
        )

    return {
        "end_mass_max": max(mass) if mass else None,
        "saturated_rows": sum(m > END_MASS_SATURATED for m in mass) / len(mass) if mass else None,
        "saturated_actions": last("actor/saturated_actions"),
        "alpha": last("alpha"),
        "entropy": last("entropy"),
        "entropy_target": last("entropy_target"),
    }


def run_metrics(
    rows: Sequence[dict[str, Any]],
    checkpoints: Sequence[int],
    threshold: float,
    wall_marks: Sequence[float] = (),
):
    """Per-run numbers: final returns, AUC, returns at env-step checkpoints and wall-clock marks
    (seconds), time to threshold and the LoRA-vs-dense metrics (critic loss, weight change,
    adapter norms)."""
    pts = curve(rows)
    evals = curve(rows, "eval_return")
    end = rows[-1] if rows else {}
    # The LoRA-vs-dense numbers come from the last row that has them (logged every few rows).
    last = next((r for r in reversed(rows) if "critic/weight_change_norm" in r), end)
    ttt = time_to_threshold(pts, threshold)
    lora_norms = [v for k, v in last.items() if k.startswith("lora/") and k.endswith("delta_norm")]
    losses = curve(rows, "critic_loss")
    return {
        "env_steps": end.get("env_steps"),
        "wall_time_s": end.get("wall_time_s"),
        "final_eval_return": float(evals[-1, 2]) if len(evals) else None,
        "final_train_return": float(pts[-1, 2]) if len(pts) else None,
        "auc_return": auc_return(pts),
        "checkpoint_returns": {
            str(c): checkpoint_return(pts, c, end.get("env_steps", 0)) for c in checkpoints
        },
        "wall_returns": {
            f"{s:g}": checkpoint_return(pts, s, end.get("wall_time_s") or 0.0, axis=1)
            for s in wall_marks
        },
        "steps_to_threshold": ttt[0] if ttt else None,
        "seconds_to_threshold": ttt[1] if ttt else None,
        "final_critic_loss": float(losses[-1, 2]) if len(losses) else None,
        "weight_change_norm": last.get("critic/weight_change_norm"),
        "weight_change_rel": last.get("critic/weight_change_rel"),
        "adapter_delta_norm": float(np.sqrt(np.sum(np.square(lora_norms)))) if lora_norms else None,
        **health_metrics(rows),
    }


SUMMARY_KEYS = (
    "final_eval_return",
    "final_train_return",
    "auc_return",
    "steps_to_threshold",
    "seconds_to_threshold",
    "wall_time_s",
    "final_critic_loss",
    "weight_change_norm",
    "weight_change_rel",
    "adapter_delta_norm",
    "end_mass_max",
    "saturated_rows",
    "saturated_actions",
    "alpha",
    "entropy",
    "entropy_target",
)


def aggregate(runs: Sequence[dict[str, Any]], checkpoints: Sequence[int]) -> dict[str, Any]:
    """Mean and bootstrap CI over seeds of every per-run number (one method on one task)."""
    out: dict[str, Any] = {"seeds": len(runs)}
    for key in SUMMARY_KEYS:
        out[key] = summarize([r.get(key) for r in runs])  # runs stored before a key existed
    out["reached_threshold"] = sum(r["steps_to_threshold"] is not None for r in runs)
    out["checkpoint_returns"] = {
        str(c): summarize([r["checkpoint_returns"][str(c)] for r in runs]) for c in checkpoints
    }
    marks = runs[0].get("wall_returns", {}) if runs else {}
    out["wall_returns"] = {m: summarize([r["wall_returns"][m] for r in runs]) for m in marks}
    return out


def mean_curve(
    curves: Sequence[np.ndarray], axis: int, num: int = 40
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Grid, mean and CI band of several runs' curves on column `axis` (env steps or seconds).
    At each grid point only the runs whose curve covers it count."""
    curves = [c for c in curves if len(c)]
    if not curves:
        return (np.zeros(0),) * 4  # type: ignore[return-value]
    lo_x = min(c[0, axis] for c in curves)
    hi_x = max(c[-1, axis] for c in curves)
    grid = np.linspace(lo_x, hi_x, num)
    mean, lo, hi = (np.full(num, np.nan) for _ in range(3))
    for i, x in enumerate(grid):
        vals = [v for c in curves if (v := value_at(c, x, axis)) is not None]
        if vals:
            mean[i] = np.mean(vals)
            lo[i], hi[i] = bootstrap_ci(vals)  # type: ignore[misc]
    return grid, mean, lo, hi
