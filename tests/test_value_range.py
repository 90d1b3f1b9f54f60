"""The automatic value range (reward scaling + a fixed symmetric support) and the saturation watch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_helpers import SMALL

from fast_lora_td3.algos.config import AlgoConfig
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.reward_scaler import RewardScaler
from fast_lora_td3.training.metrics_window import ValueRangeWatch
from fast_lora_td3.training.trainer import Trainer


def brute_force_scale(rewards: list[list[float]], dones: list[list[bool]], gamma: float, g: float):
    """Loop over steps and envs: G per env, population variance of every G seen, max |G|."""
    num_envs = len(rewards[0])
    running = [0.0] * num_envs
    seen: list[float] = []
    for r_t, d_t in zip(rewards, dones, strict=True):
        for e in range(num_envs):
            running[e] = gamma * running[e] + r_t[e]
            seen.append(running[e])
            if d_t[e]:
                running[e] = 0.0
    mean = sum(seen) / len(seen)
    var = sum((x - mean) ** 2 for x in seen) / len(seen)
    return max(math.sqrt(var + 1e-8), max(abs(x) for x in seen) / g), seen


@pytest.mark.parametrize(("reward_scale", "g_max"), [(0.01, 5.0), (100.0, 5.0), (-3.0, 2.0)])
def test_reward_scale_matches_brute_force_and_bounds_every_seen_return(
    reward_scale: float, g_max: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    steps, envs, gamma = 60, 5, 0.97
    rewards = (torch.rand(steps, envs, generator=gen) + 0.2) * reward_scale
    dones = torch.rand(steps, envs, generator=gen) < 0.05
    scaler = RewardScaler(g_max)
    assert float(scaler.scale()) == 1.0  # nothing seen yet
    running = torch.zeros(envs)
    for r, d in zip(rewards, dones, strict=True):  # as the collector does it
        running = running * gamma + r
        scaler.update(running)
        running = torch.where(d, 0.0, running)
    expected, seen = brute_force_scale(rewards.tolist(), dones.tolist(), gamma, g_max)
    assert float(scaler.scale()) == pytest.approx(expected, rel=1e-5)
    assert max(abs(x) for x in seen) / float(scaler.scale()) <= g_max * (1 + 1e-6)
    assert torch.allclose(scaler(rewards), rewards / expected, rtol=1e-5)


def test_unset_range_is_automatic_and_explicit_range_means_what_it_says() -> None:
    auto = AlgoConfig()
    assert auto.auto_value_range and auto.support_bounds() == (-10.0, 10.0)
    fixed = AlgoConfig(v_min=-100.0, v_max=1000.0)
    assert not fixed.auto_value_range and fixed.support_bounds() == (-100.0, 1000.0)
    with pytest.raises(ConfigError, match=r"algo\.v_min=None and algo\.v_max=5.0: set both"):
        AlgoConfig(v_max=5.0)
    with pytest.raises(ConfigError, match=r"algo\.return_scale_max"):
        AlgoConfig(return_scale_max=0.0)


def test_published_recipes_keep_their_support_and_user_tasks_get_the_automatic_one() -> None:
    for preset, bounds in [
        ("g1_flat_fasttd3_lora", (-10.0, 10.0)),
        ("isaac_g1_flat_fasttd3_lora", (-10.0, 10.0)),
        ("g1_flat_fastsac", (-20.0, 20.0)),
        ("pendulum_cpu", (-300.0, 10.0)),
    ]:
        algo = compose_config([f"experiment={preset}"]).algo
        assert algo.support_bounds() == bounds and not algo.auto_value_range, preset
    for preset in ("halfcheetah_cpu", "hopper_cpu"):  # measured: the automatic range learns better
        assert compose_config([f"experiment={preset}"]).algo.auto_value_range, preset
    for algo_name in ("fasttd3", "fastsac"):
        cfg = compose_config(["env=gymnasium", "env.task=Hopper-v5", f"algo={algo_name}"])
        assert cfg.algo.auto_value_range, algo_name


def test_watch_warns_once_after_consecutive_saturated_rows() -> None:
    watch = ValueRangeWatch((-10.0, 10.0), auto=False, threshold=0.1, rows=3)
    hot = {"value/end_mass_low": 0.0, "value/end_mass_high": 0.4}
    cold = {"value/end_mass_low": 0.0, "value/end_mass_high": 0.01}
    assert [watch.check(r) for r in (hot, hot, cold, hot, hot)] == [None] * 5  # streak broken
    line = watch.check(hot)
    assert line is not None and "algo.v_max=10" in line and "unset algo.v_min/algo.v_max" in line
    assert "\n" not in line and watch.check(hot) is None  # once per run
    assert watch.check({"critic_loss": 1.0}) is None  # rows without updates are ignored


def train_rows(tmp_path: Path, extra: list[str]) -> list[dict]:
    overrides = [*SMALL, "total_steps=2400", "algo.gamma=0.99", "log_interval=10", *extra]
    trainer = Trainer(compose_config(overrides), tmp_path)
    trainer.train()
    trainer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_fixed_support_below_the_returns_warns_and_the_automatic_range_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The point mass earns about 1 per step, so γ = 0.99 returns reach tens: a [-1, 1] support
    saturates; the automatic range scales them into its support."""
    rows = train_rows(tmp_path / "fixed", ["algo.v_min=-1", "algo.v_max=1"])
    out = capsys.readouterr().out
    assert "end atom algo.v_max=1 " in out and out.count("warning: ") == 1
    late = [r for r in rows if "value/end_mass_high" in r][-3:]
    assert min(r["value/end_mass_high"] for r in late) > 0.1
    assert all(r["value/q_max_pos"] > 0.9 for r in late)
    assert all("actor/saturated_actions" in r for r in late)

    rows = train_rows(tmp_path / "auto", [])
    out = capsys.readouterr().out
    assert "warning: " not in out
    late = [r for r in rows if "value/end_mass_high" in r][-3:]
    assert max(r["value/end_mass_high"] for r in late) < 0.02
    assert all(r["value/reward_scale"] > 1.0 for r in late)  # returns of tens scaled down
    assert all(0.0 < r["value/q_max_pos"] < 0.9 for r in late)


def test_fastsac_rows_carry_what_a_sac_user_reads(tmp_path: Path) -> None:
    """α, entropy against its target, the critic's end-atom share and saturated actions."""
    overrides = [*SMALL, "algo=fastsac", "algo.batch_size=64", "algo.buffer_size=64"]
    overrides += ["algo.n_step=3", "algo.num_updates=2", "total_steps=800"]
    trainer = Trainer(compose_config(overrides), tmp_path)
    trainer.train()
    trainer.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in reversed(rows) if "alpha" in r)
    for key in ("alpha", "entropy", "entropy_target", "policy_entropy", "value/end_mass_high"):
        assert math.isfinite(row[key]), key
    assert row["entropy_target"] == 0.0 and "value/reward_scale" in row
    assert 0.0 <= row["actor/saturated_actions"] <= 1.0
