"""`play`: deterministic episodes of a checkpoint (torch), of an exported ONNX policy
(onnxruntime), or of both from the same seeded resets (sim-to-sim check)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.cpu_defaults import explicit_keys
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import resolve_runtime
from fast_lora_td3.deploy.export import read_onnx_metadata
from fast_lora_td3.deploy.inference import (
    build_learner,
    load_for_inference,
    resolve_checkpoint,
    split_overrides,
)
from fast_lora_td3.errors import ConfigError


@dataclass
class PlayArgs:
    """The keys `play` reads itself; every other key=value overrides the run's saved config."""

    checkpoint: str | None = None
    """Checkpoint file, or a run directory (its latest checkpoint), to play with torch."""
    exported: str | None = None
    """An exported policy.onnx to play with onnxruntime (with checkpoint= too: both, compared)."""
    episodes: int = 1
    """Deterministic episodes to run, episode i from a reset seeded with the seed + i."""
    video_length: int = 200
    """Frames per video under env.video=true (written to <run>/videos/play_<policy>.mp4)."""


def play_num_envs(cfg: TrainConfig, overrides: list[str]) -> int:
    """The envs play runs: `env.num_envs` (`--num_envs`) when the command line sets it, else the
    run's `eval.num_envs` (the training env count would be far too many to watch)."""
    keys = explicit_keys(overrides)
    if "env.num_envs" not in keys:
        return cfg.eval.num_envs
    if "eval.num_envs" in keys and cfg.eval.num_envs != cfg.env.num_envs:
        raise ConfigError(
            f"env.num_envs={cfg.env.num_envs} and eval.num_envs={cfg.eval.num_envs}: play runs one "
            "set of envs; give one of them (--num_envs N sets env.num_envs)"
        )
    return cfg.env.num_envs


def onnx_policy(path: Path, device: torch.device) -> Any:
    """An onnxruntime session wrapped as `obs tensor → action tensor` (no torch model involved)."""
    import onnxruntime as ort

    if not Path(path).is_file():
        raise ConfigError(f"exported={path} does not exist (expected <run>/exported/policy.onnx)")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def act(obs: torch.Tensor) -> torch.Tensor:
        out = session.run(["actions"], {"obs": obs.detach().cpu().float().numpy()})[0]
        return torch.from_numpy(out).to(device)

    return act


def config_from_exported(path: Path, overrides: list[str]) -> TrainConfig:
    """A config for the env an exported policy was trained on (backend and task from its ONNX
    metadata), with `overrides` applied; used when play gets `exported=` without a checkpoint."""
    if not Path(path).is_file():
        raise ConfigError(f"exported={path} does not exist (expected <run>/exported/policy.onnx)")
    meta = read_onnx_metadata(Path(path))
    if "task" not in meta or "backend" not in meta:
        raise ConfigError(f"exported={path} has no task/backend metadata: pass checkpoint=RUN too")
    cfg = compose_config([f"env.backend={meta['backend']}", f"env.task={meta['task']}", *overrides])
    resolve_runtime(cfg, env_seed=False)  # play's episodes reseed the simulator themselves
    return cfg


def seeded_episode(act: Any, env: Any, seed: int, max_steps: int | None) -> dict[str, float]:
    """One deterministic evaluation from a reset with `seed`: torch's RNG and the simulator's are
    re-seeded first, so two policies run from exactly the same initial states (apples to apples)."""
    from fast_lora_td3.training.evaluation import evaluate

    torch.manual_seed(seed)
    env.reset(seed=seed)  # `evaluate`'s own reset then draws from this freshly seeded stream
    return evaluate(act, env, max_steps)


def run_play(overrides: list[str]) -> int:
    """Deterministic episodes of `checkpoint=` (torch) and/or `exported=…/policy.onnx`
    (onnxruntime, sim-to-sim); with both, each episode seed runs twice and the returns are compared."""
    from fast_lora_td3.envs import make_env

    own, rest = split_overrides(overrides)
    exported = Path(own["exported"]) if own.get("exported") else None
    if own.get("checkpoint") or exported is None:
        ckpt = resolve_checkpoint(own.get("checkpoint"))
        cfg, state = load_for_inference(ckpt, rest)
    else:
        cfg, state = config_from_exported(exported, rest), None
    try:
        episodes = int(own.get("episodes", PlayArgs.episodes))
    except ValueError:
        raise ConfigError(f"episodes={own['episodes']!r} must be an integer >= 1") from None
    if episodes < 1:
        raise ConfigError(f"episodes={episodes} must be an integer >= 1")
    cfg.env.num_envs = play_num_envs(cfg, rest)
    torch.manual_seed(cfg.seed)
    env = make_env(cfg.env)
    try:
        policies: dict[str, Any] = {}
        if state is not None:
            policies["torch"] = build_learner(cfg, env, state).act
        if exported is not None:
            _check_exported_matches(exported, env.obs_dim, env.action_dim)
            policies["onnx"] = onnx_policy(exported, env.device)
        worst = 0.0
        for i in range(episodes):
            seed = (cfg.seed if cfg.env.seed is None else cfg.env.seed) + i
            returns = {}
            for name, act in policies.items():
                stats = seeded_episode(act, env, seed, cfg.eval.max_steps)
                returns[name] = stats["eval_return"]
                print(
                    f"{name:5s} policy  episode {i} (seed {seed}): return "
                    f"{stats['eval_return']:.6f}  length {stats['eval_length']:.1f}  "
                    f"({env.num_envs} envs)",
                    flush=True,
                )
            if len(returns) == 2:
                worst = max(worst, abs(returns["onnx"] - returns["torch"]))
        if len(policies) == 2:
            print(f"sim-to-sim: max |return(onnx) - return(torch)| = {worst:.3e}", flush=True)
        if cfg.env.video:
            _record(policies, env, own, ckpt if state is not None else exported)
    finally:
        env.close()
    return 0


def _record(policies: dict[str, Any], env: Any, own: dict[str, str], source: Path) -> None:
    """`env.video=true`: write one MP4 per policy next to the run's other outputs."""
    from fast_lora_td3.runs.video import record_video

    try:
        length = int(own.get("video_length", PlayArgs.video_length))
    except ValueError:
        raise ConfigError(f"video_length={own['video_length']!r} must be an integer") from None
    run_dir = source.parent.parent
    for name, act in policies.items():
        path = record_video(act, env, run_dir / "videos" / f"play_{name}.mp4", length=length)
        print(f"video: {path}", flush=True)


def _check_exported_matches(path: Path, obs_dim: int, action_dim: int) -> None:
    """The ONNX policy's declared obs/action sizes must match the env it is played in."""
    meta = read_onnx_metadata(path)
    for key, have in (("obs_dim", obs_dim), ("action_dim", action_dim)):
        if key in meta and int(meta[key]) != have:
            raise ConfigError(
                f"exported={path}: policy {key}={meta[key]} but the env has {key}={have}"
            )
