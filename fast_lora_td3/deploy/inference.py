"""A trained run loaded for inference, shared by `play` and `export`: the commands' own keys, the
checkpoint file, the saved config with overrides, and a learner holding the checkpoint's weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fast_lora_td3.config.compose import compose_run_config
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import resolve_runtime
from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.runs.checkpoint import CheckpointManager, load_file, warn_skipped

__all__ = ["build_learner", "load_for_inference", "resolve_checkpoint", "split_overrides"]

PPO_CHECKPOINT = "ppo_*.pt"
"""Checkpoints of the rsl_rl PPO baseline (`algo=ppo`): rsl_rl's format, not a training state."""
PPO_REFUSAL = (
    "is an algo=ppo (rsl_rl) checkpoint: play and export take FastTD3/FastSAC checkpoints only; "
    "load it with rsl_rl's OnPolicyRunner.load"
)
_SIZE_MISMATCH = re.compile(
    r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
    r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)
"""The first shape mismatch in `Module.load_state_dict`'s error: parameter, checkpoint, model."""

COMMAND_KEYS = ("checkpoint", "exported", "episodes", "out", "video_length")
"""Keys `play` / `export` read themselves; every other `key=value` overrides the run's config."""


def split_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """Separate the command's own keys (`COMMAND_KEYS`) from config overrides."""
    own, rest = {}, []
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"bad override {item!r}: expected key=value")
        if key in COMMAND_KEYS:
            own[key] = value
        else:
            rest.append(item)
    return own, rest


def resolve_checkpoint(path: str | None) -> Path:
    """A checkpoint file, or the latest checkpoint of a run directory."""
    if not path:
        raise ConfigError("checkpoint=PATH is required (a checkpoint file or a run directory)")
    p = Path(path)
    if p.is_dir():
        ckpt_dir = p / "checkpoints" if (p / "checkpoints").is_dir() else p
        latest, skipped = CheckpointManager(ckpt_dir, keep_last=1_000_000).scan()
        if latest is None and skipped:  # one line: the error, not a warning per file before it
            raise CheckpointError(
                f"checkpoint={path}: all {len(skipped)} checkpoints in {ckpt_dir} are corrupt "
                f"(newest: {skipped[0][0].name}, {skipped[0][1]})"
            )
        for skipped_path, reason in skipped:
            warn_skipped(skipped_path, reason)
        if latest is None:
            if any(ckpt_dir.glob(PPO_CHECKPOINT)):
                raise CheckpointError(f"checkpoint={path} {PPO_REFUSAL}")
            raise CheckpointError(f"checkpoint={path}: no checkpoint found in {ckpt_dir}")
        return latest
    if not p.exists():
        raise CheckpointError(f"checkpoint={path} does not exist")
    return p


def load_for_inference(ckpt: Path, overrides: list[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The saved run's config with `overrides` applied, and the checkpoint state."""
    if ckpt.match(PPO_CHECKPOINT):
        raise CheckpointError(f"checkpoint={ckpt} {PPO_REFUSAL}")
    state = load_file(ckpt)
    if "learner" not in state or "config" not in state:
        raise CheckpointError(f"checkpoint={ckpt} is not a fast-lora-td3 training checkpoint")
    cfg = compose_run_config(state["config"], overrides)
    resolve_runtime(cfg, env_seed=False)  # play's episodes reseed the simulator themselves
    return cfg, state


def build_learner(cfg: TrainConfig, env: Any, state: dict[str, Any]) -> Any:
    """A learner with the checkpoint's weights."""
    from fast_lora_td3.algos import make_learner

    learner = make_learner(
        cfg.algo,
        cfg.critic,
        cfg.actor,
        env.obs_dim,
        env.critic_obs_dim,
        env.action_dim,
        cfg.device,
    )
    try:
        learner.load_state_dict(state["learner"])
    except RuntimeError as exc:
        m = _SIZE_MISMATCH.search(str(exc))
        if m is None:
            raise
        module = re.search(r"state_dict for (\w+)", str(exc))
        name = f"{module.group(1)}.{m.group(1)}" if module else m.group(1)
        env_cfg = state["config"]["env"]
        raise CheckpointError(
            f"checkpoint does not fit env.task={cfg.env.task} (backend {cfg.env.backend}): "
            f"{name} has shape {m.group(2)} in the checkpoint but {m.group(3)} for this env; "
            f"play it on its own task (env.task={env_cfg['task']} env.backend={env_cfg['backend']})"
        ) from None
    return learner
