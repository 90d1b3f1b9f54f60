"""`play` (deterministic episodes of a checkpoint, or of an exported ONNX policy) and `export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from fast_lora_td3.checkpoint import CheckpointManager
from fast_lora_td3.config import TrainConfig, register_configs
from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.validate import resolve_device


def split_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """Separate the command's own keys (checkpoint, exported, episodes, out) from config overrides."""
    own, rest = {}, []
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"bad override {item!r}: expected key=value")
        if key in ("checkpoint", "exported", "episodes", "out"):
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
        latest = CheckpointManager(ckpt_dir, keep_last=1_000_000).latest()
        if latest is None:
            raise CheckpointError(f"checkpoint={path}: no checkpoint found in {ckpt_dir}")
        return latest
    if not p.exists():
        raise CheckpointError(f"checkpoint={path} does not exist")
    return p


def load_for_inference(ckpt: Path, overrides: list[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The saved run's config with `overrides` applied, and the checkpoint state."""
    state = CheckpointManager(ckpt.parent, keep_last=1_000_000).load(ckpt, map_location="cpu")
    register_configs()
    base = OmegaConf.structured(TrainConfig)
    try:
        merged = OmegaConf.merge(base, state["config"], OmegaConf.from_dotlist(overrides))
        cfg: TrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise ConfigError(f"bad override: {str(exc).splitlines()[0]}") from None
    cfg.device = resolve_device(cfg.device)
    cfg.env.device = cfg.device
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
    learner.load_state_dict(state["learner"])
    return learner


def onnx_policy(path: Path, device: torch.device) -> Any:
    """An onnxruntime session wrapped as `obs tensor → action tensor` (no torch model involved)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def act(obs: torch.Tensor) -> torch.Tensor:
        out = session.run(["actions"], {"obs": obs.detach().cpu().float().numpy()})[0]
        return torch.from_numpy(out).to(device)

    return act


def run_play(overrides: list[str]) -> int:
    """Deterministic episodes; prints return and length statistics (and compares ONNX vs torch)."""
    from fast_lora_td3.envs import make_env
    from fast_lora_td3.evaluation import evaluate

    own, rest = split_overrides(overrides)
    ckpt = resolve_checkpoint(own.get("checkpoint"))
    cfg, state = load_for_inference(ckpt, rest)
    env_cfg = cfg.env
    env_cfg.num_envs = cfg.eval.num_envs
    torch.manual_seed(cfg.seed)
    env = make_env(env_cfg)
    try:
        learner = build_learner(cfg, env, state)
        episodes = int(own.get("episodes", 1))
        for i in range(episodes):
            stats = evaluate(learner.act, env, cfg.eval.max_steps)
            print(
                f"torch policy  episode {i}: return {stats['eval_return']:.4f}  "
                f"length {stats['eval_length']:.1f}  ({env.num_envs} envs)",
                flush=True,
            )
            if "exported" in own:
                act = onnx_policy(Path(own["exported"]), env.device)
                onnx_stats = evaluate(act, env, cfg.eval.max_steps)
                print(
                    f"onnx  policy  episode {i}: return {onnx_stats['eval_return']:.4f}  "
                    f"length {onnx_stats['eval_length']:.1f}  "
                    f"(|Δreturn| = {abs(onnx_stats['eval_return'] - stats['eval_return']):.2e})",
                    flush=True,
                )
    finally:
        env.close()
    return 0


def run_export(overrides: list[str]) -> int:
    """Export a checkpoint's policy into `<run>/exported/` (or `out=DIR`)."""
    from fast_lora_td3.envs import make_env
    from fast_lora_td3.export import export_policy

    own, rest = split_overrides(overrides)
    ckpt = resolve_checkpoint(own.get("checkpoint"))
    cfg, state = load_for_inference(ckpt, rest)
    cfg.env.num_envs = 1
    env = make_env(cfg.env)
    try:
        learner = build_learner(cfg, env, state)
        out = Path(own.get("out") or ckpt.parent.parent / "exported")
        paths = export_policy(learner, env, out, cfg, int(state.get("env_steps", 0)))
    finally:
        env.close()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
