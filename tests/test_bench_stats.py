"""`bench learn` aggregation against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from fast_lora_td3.bench.stats import (
    aggregate,
    auc_return,
    bootstrap_ci,
    bootstrap_diff_ci,
    curve,
    health_metrics,
    mean_curve,
    run_metrics,
    time_to_threshold,
    value_at,
)

ROWS = [
    {"env_steps": 100, "wall_time_s": 1.0, "critic_loss": 5.0},  # no episode ended yet
    {"env_steps": 200, "wall_time_s": 2.0, "episode_return": 10.0},
    {"env_steps": 400, "wall_time_s": 5.0, "episode_return": 30.0, "critic_loss": 3.0},
    {"env_steps": 600, "wall_time_s": 9.0, "episode_return": 20.0},
    {
        "env_steps": 800,
        "wall_time_s": 10.0,
        "episode_return": 60.0,
        "eval_return": 55.0,
        "critic/weight_change_norm": 2.5,
        "lora/critic.a/delta_norm": 3.0,
        "lora/critic.b/delta_norm": 4.0,
        "lora/critic.a/effective_rank": 9.0,
    },
    {"env_steps": 900, "wall_time_s": 11.0, "critic_loss": 2.0},  # no episode ended since 800
]


def test_checkpoint_interpolation_auc_and_threshold_by_hand() -> None:
    pts = curve(ROWS)
    assert pts.tolist() == [[200, 2, 10], [400, 5, 30], [600, 9, 20], [800, 10, 60]]
    assert value_at(pts, 300) == pytest.approx(20.0)  # halfway between 10 and 30
    assert value_at(pts, 500) == pytest.approx(25.0)
    assert value_at(pts, 800) == pytest.approx(60.0)
    assert value_at(pts, 100) is None and value_at(pts, 801) is None  # outside the run
    assert value_at(pts, 7.0, axis=1) == pytest.approx(25.0)  # on wall-clock: (5 s, 30) → (9 s, 20)
    # Trapezoids: 200·(10+30)/2 + 200·(30+20)/2 + 200·(20+60)/2 = 4000 + 5000 + 8000 over 600 steps.
    assert auc_return(pts) == pytest.approx(17000 / 600)
    assert time_to_threshold(pts, 25.0) == (400.0, 5.0)  # the first row at or above 25
    assert time_to_threshold(pts, 60.0) == (800.0, 10.0)
    assert time_to_threshold(pts, 61.0) is None


def test_run_metrics_collects_final_returns_and_section4_metrics() -> None:
    m = run_metrics(ROWS, checkpoints=[300, 850, 1000], threshold=25.0)
    assert m["final_eval_return"] == 55.0 and m["final_train_return"] == 60.0
    # 850: past the last episode (800) but the run got there (900): the last return holds.
    assert m["checkpoint_returns"] == {"300": pytest.approx(20.0), "850": 60.0, "1000": None}
    assert m["env_steps"] == 900 and m["wall_time_s"] == 11.0
    assert m["steps_to_threshold"] == 400.0 and m["seconds_to_threshold"] == 5.0
    assert m["final_critic_loss"] == 2.0 and m["weight_change_norm"] == 2.5
    assert m["adapter_delta_norm"] == pytest.approx(5.0)  # sqrt(3² + 4²); ranks are not norms
    assert m["end_mass_max"] is None and m["alpha"] is None  # never logged: not zero


def test_health_reads_the_worst_end_mass_the_saturated_share_and_the_last_sac_row() -> None:
    rows = [
        {"value/end_mass_low": 0.02, "value/end_mass_high": 0.05, "actor/saturated_actions": 0.9},
        {"episode_return": 3.0},  # a row without an update window
        {"value/end_mass_low": 0.30, "value/end_mass_high": 0.01, "alpha": 0.2, "entropy": -5.0},
        {"value/end_mass_low": 0.00, "value/end_mass_high": 0.12, "actor/saturated_actions": 0.1},
        {"value/end_mass_low": 0.04, "value/end_mass_high": 0.10, "entropy_target": -6.0},
    ]
    h = health_metrics(rows)
    assert h["end_mass_max"] == 0.30  # the low end of row 3
    assert h["saturated_rows"] == pytest.approx(2 / 4)  # 0.30 and 0.12 exceed 0.1; 0.10 does not
    assert h["saturated_actions"] == 0.1 and h["alpha"] == 0.2  # the last row that logged each
    assert (h["entropy"], h["entropy_target"]) == (-5.0, -6.0)


def test_bootstrap_ci_exact_enumeration_by_hand() -> None:
    # [0, 1]: resampled means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    # [0, 0, 3]: the mean is the number k of 3s drawn, k ~ Binomial(3, 1/3):
    # CDF 8/27 = 0.296 at 0, 20/27 = 0.741 at 1, 26/27 = 0.963 at 2, 1 at 3.
    assert bootstrap_ci([0.0, 0.0, 3.0]) == (0.0, 3.0)
    # [0, 0, 0, 0, 4]: k ~ Binomial(5, 1/5), mean = 4k/5; CDF(k=0) = 0.328 ≥ 0.025 and
    # CDF(k=2) = 0.942 < 0.975 ≤ CDF(k=3) = 0.993, so the interval is [0, 12/5].
    lo, hi = bootstrap_ci([0.0, 0.0, 0.0, 0.0, 4.0])
    assert (lo, hi) == (0.0, pytest.approx(12 / 5))
    assert bootstrap_ci([7.0]) == (7.0, 7.0) and bootstrap_ci([]) is None
    # Beyond 6 seeds: Monte Carlo, still a CI around the mean and reproducible.
    many = np.arange(10.0)
    ci = bootstrap_ci(many)
    assert ci == bootstrap_ci(many) and ci[0] < 4.5 < ci[1]
    assert bootstrap_diff_ci([1.0, 1.0], [0.0, 0.0]) == (1.0, 1.0)
    # A one-seed group has no spread: no difference CI rather than a falsely narrow one.
    assert bootstrap_diff_ci([1.0, 2.0, 3.0], [0.5]) is None
    lo, hi = bootstrap_diff_ci([1.0, 2.0, 3.0], [0.0, 1.0])
    assert lo < 1.5 < hi


def test_aggregate_over_seeds_and_mean_curve() -> None:
    other = [dict(r) for r in ROWS]
    for r in other:
        if "episode_return" in r:
            r["episode_return"] += 10.0
    runs = [run_metrics(rows, [300], 25.0) for rows in (ROWS, other)]
    agg = aggregate(runs, [300])
    assert agg["seeds"] == 2
    assert agg["checkpoint_returns"]["300"]["mean"] == pytest.approx(25.0)
    assert agg["checkpoint_returns"]["300"]["ci95"] == [pytest.approx(20.0), pytest.approx(30.0)]
    assert agg["final_train_return"]["mean"] == pytest.approx(65.0)
    assert agg["reached_threshold"] == 2
    grid, mean, lo, hi = mean_curve([curve(ROWS), curve(other)], axis=0, num=4)
    assert grid.tolist() == [200.0, 400.0, 600.0, 800.0]
    assert mean.tolist() == [15.0, 35.0, 25.0, 65.0]
    assert lo.tolist() == [10.0, 30.0, 20.0, 60.0] and hi.tolist() == [20.0, 40.0, 30.0, 70.0]


def test_wall_clock_marks_interpolate_in_seconds_and_aggregate_over_seeds() -> None:
    m = run_metrics(ROWS, checkpoints=[], threshold=25.0, wall_marks=[3.5, 9.5, 10.5, 20.0])
    # 3.5 s: halfway between 2 s (10) and 5 s (30); 9.5 s: between 9 s (20) and 10 s (60).
    assert m["wall_returns"]["3.5"] == pytest.approx(20.0)
    assert m["wall_returns"]["9.5"] == pytest.approx(40.0)
    # 10.5 s: past the last episode (10 s) but the run reached 11 s: the last return holds.
    assert m["wall_returns"]["10.5"] == 60.0 and m["wall_returns"]["20"] is None
    agg = aggregate([m, m], [])
    assert agg["wall_returns"]["3.5"]["mean"] == pytest.approx(20.0)
