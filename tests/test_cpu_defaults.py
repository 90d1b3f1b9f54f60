"""CPU-sized defaults, time-based logging, and the weight-change-from-init metric."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import SMALL
from torch import nn

from fast_lora_td3.cli import translate_overrides
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.cpu_defaults import apply_cpu_defaults, explicit_keys
from fast_lora_td3.training import trainer as trainer_module
from fast_lora_td3.training.trainer import Trainer
from fast_lora_td3.training.weight_change import weight_change_norms, weight_snapshot


def _sized(overrides: list[str]) -> tuple[object, str | None]:
    overrides = translate_overrides(overrides)
    cfg = compose_config(overrides)
    return cfg, apply_cpu_defaults(cfg, explicit_keys(overrides))


def test_unset_gpu_recipe_sizes_become_cpu_sizes_and_one_line_says_so() -> None:
    cfg, note = _sized(["env=gymnasium", "env.task=HalfCheetah-v5", "env.num_envs=8"])
    assert cfg.algo.batch_size == 256 and cfg.critic.hidden_dims == [256, 256]
    assert cfg.actor.hidden_dims == [256, 256]
    assert cfg.algo.num_updates == 1  # 8 gymnasium envs step in ~1 ms: one update per step
    assert cfg.env.num_envs == 8  # gymnasium env counts are the user's
    assert note is not None and "\n" not in note
    assert "algo.batch_size=256" in note and "cpu_defaults=false" in note


def test_mjlab_default_gets_fewer_envs_and_batch_is_a_multiple_of_them() -> None:
    cfg, note = _sized(["critic=simbav2_lora"])
    assert cfg.env.num_envs == 16 and cfg.algo.batch_size % 16 == 0
    assert (cfg.critic.width, cfg.critic.num_blocks) == (128, 1)
    assert cfg.critic.rank < cfg.critic.width
    assert cfg.algo.num_updates == 2  # tabled: a 64 ms mjlab step holds two 25 ms updates
    assert "env.num_envs=16" in note


def test_values_the_user_or_preset_set_are_kept_even_when_equal_to_the_defaults() -> None:
    cfg, note = _sized(
        ["env=gymnasium", "algo.batch_size=32768", "--num_envs", "16", "++actor.hidden_dims=[64]"]
    )
    assert cfg.algo.batch_size == 32768  # typed by the user: kept, although it is the default
    assert cfg.critic.hidden_dims == [256, 256] and cfg.actor.hidden_dims == [64]
    assert cfg.env.num_envs == 16 and "algo.batch_size" not in note
    cfg, note = _sized(["experiment=pendulum_cpu"])
    assert note is None and cfg.algo.batch_size == 256 and cfg.critic.hidden_dims == [128, 128]
    cfg, note = _sized(["experiment=g1_flat_fasttd3_lora", "device=cpu"])
    assert cfg.algo.batch_size == 8192 and cfg.env.num_envs == 4096 and cfg.critic.width == 512
    cfg, note = _sized(["env=gymnasium", "cpu_defaults=false"])
    assert note is None and cfg.algo.batch_size == 32768


def test_fasttd3_actor_lr_follows_the_cpu_batch() -> None:
    """FastTD3's actor lr becomes CPU_TD3_ACTOR_LR only with the CPU batch; a batch or lr set by the
    user or a preset, and FastSAC, keep theirs."""
    from fast_lora_td3.algos.config import AlgoConfig
    from fast_lora_td3.config.cpu_defaults import CPU_TD3_ACTOR_LR

    recipe = AlgoConfig().actor_lr
    assert recipe > CPU_TD3_ACTOR_LR
    gym = ["env=gymnasium", "env.task=Hopper-v5", "env.num_envs=16"]
    cfg, note = _sized(gym)
    assert cfg.algo.actor_lr == CPU_TD3_ACTOR_LR and f"algo.actor_lr={CPU_TD3_ACTOR_LR}" in note
    assert _sized(["critic=simbav2_lora"])[0].algo.actor_lr == CPU_TD3_ACTOR_LR  # mjlab too
    for overrides, lr in (
        ([*gym, "algo.actor_lr=3e-4"], 3e-4),
        ([*gym, "algo.batch_size=512"], recipe),
        (["experiment=hopper_cpu"], recipe),
        (["experiment=cartpole_cpu"], 1e-3),
        (["experiment=g1_flat_fasttd3_lora", "device=cpu"], recipe),
        ([*gym, "algo=fastsac"], recipe),
        ([*gym, "cpu_defaults=false"], recipe),
    ):
        cfg, note = _sized(overrides)
        assert cfg.algo.actor_lr == lr, overrides
        assert "algo.actor_lr" not in (note or ""), overrides


def test_first_training_episode_is_logged_as_soon_as_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No step-based row is due (log_interval huge): the first row is the one that reports the
    first finished episode, at the iteration it ended; later rows come from log_interval_s."""
    monkeypatch.setattr(trainer_module, "FIRST_EPISODE_POLL_S", 0.0)
    overrides = [*SMALL, "total_steps=2400", "log_interval=1000000", "log_interval_s=0"]
    cfg = compose_config([*overrides, "export_at_end=false"])
    trainer = Trainer(cfg, tmp_path)
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    assert "episode_return" in first and "eval_return" not in first
    assert first["env_steps"] < 2400
    # Logged the iteration the episode ended: all episodes so far had that length.
    assert first["env_steps"] == first["episode_length"] * cfg.env.num_envs
    assert "critic/weight_change_norm" in first and "lora/" in " ".join(first)
    assert "eval_return" in rows[-1]


def test_weight_change_norm_matches_hand_computed_value() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        net[2].weight.copy_(torch.tensor([[2.0, 0.0]]))
    init = weight_snapshot(net)
    with torch.no_grad():
        net[0].weight.add_(torch.tensor([[3.0, 0.0], [0.0, 0.0]]))
        net[2].weight.add_(torch.tensor([[0.0, 4.0]]))
        net[0].bias.add_(100.0)  # biases are not weight matrices
    out = weight_change_norms(net, init)
    assert out["critic/weight_change_norm"].item() == pytest.approx(5.0)  # sqrt(3² + 4²)
    assert out["critic/weight_change_rel"].item() == pytest.approx(5.0 / 3.0)  # ‖W0‖ = sqrt(9)


def _first_episode_row(tmp_path: Path, args: list[str], budget_s: float = 240.0) -> dict:
    """Start a CPU training run with a huge step budget, wait for a metrics row with
    episode_return, then stop the run."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "fast_lora_td3.cli", "train", *args]
    cmd += ["device=cpu", "total_steps=100000000", f"log_dir={tmp_path}", "progress=false"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + budget_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            for path in tmp_path.glob("*/*/metrics.jsonl"):
                for line in path.read_text().splitlines():
                    row = json.loads(line)
                    if row.get("episode_return") is not None:
                        return row
            time.sleep(1.0)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    raise AssertionError(f"no episode_return row; output tail:\n{out.decode()[-3000:]}")


@pytest.mark.parametrize(
    "args",
    [["env=gymnasium"], []],  # gymnasium's default (Pendulum-v1) and the default mjlab G1
    ids=["gymnasium", "mjlab"],
)
def test_default_config_on_cpu_logs_a_training_episode_return_early(
    tmp_path: Path, args: list[str]
) -> None:
    """A first-time user's run shows a return in the first half minute of training
    (the bound is loose: the CI machine is shared)."""
    row = _first_episode_row(tmp_path, args)
    assert row["wall_time_s"] < 60.0
    assert "eval_return" not in row  # from training episodes, before any evaluation
