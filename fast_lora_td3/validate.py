"""Config validation before anything heavy starts (SPEC §11): one clear line per mistake."""

from __future__ import annotations

import torch

from fast_lora_td3.algos import LEARNERS
from fast_lora_td3.config import TrainConfig
from fast_lora_td3.envs.factory import check_device, validate_env_config
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.actor import validate_actor_config
from fast_lora_td3.nn.critic import critic_adapted_widths, validate_critic_config
from fast_lora_td3.update_mode import parse_flag

ALGOS = (*LEARNERS, "ppo")


def _choice(key: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(valid)}")


def resolve_device(device: str) -> str:
    """`auto` → `cuda` when available else `cpu`; CUDA requested but absent is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device, key="device")
    return device


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError on the first invalid setting."""
    algo, critic, env = cfg.algo, cfg.critic, cfg.env
    _choice("algo", algo.name, ALGOS)
    validate_env_config(env, check_runtime=False)  # device / package: at start-up and make_env
    validate_critic_config(critic)
    validate_actor_config(cfg.actor)
    _choice("amp", cfg.amp, ("none", "bf16"))
    parse_flag("compile", cfg.compile)
    parse_flag("cuda_graph", cfg.cuda_graph)
    _choice("logger", cfg.logger, ("tensorboard", "wandb"))
    _choice("nan_action", cfg.nan_action, ("stop", "skip"))
    _choice("algo.actor_q_reduce", algo.actor_q_reduce, ("min", "mean"))
    if cfg.total_steps <= 0:
        raise ConfigError(f"total_steps must be > 0 (got {cfg.total_steps})")
    if cfg.eval.num_envs <= 0:
        raise ConfigError(f"eval.num_envs must be > 0 (got {cfg.eval.num_envs})")
    if cfg.log_interval <= 0:
        raise ConfigError(f"log_interval must be > 0 iterations (got {cfg.log_interval})")
    if algo.name == "ppo":
        return
    _choice("algo.replay_obs_dtype", algo.replay_obs_dtype, ("float32", "bfloat16"))
    _choice(
        "algo.replay_action_dtype", algo.replay_action_dtype, ("float32", "bfloat16", "float16")
    )
    if algo.v_min >= algo.v_max:
        raise ConfigError(f"algo.v_min ({algo.v_min}) must be < algo.v_max ({algo.v_max})")
    if algo.num_atoms < 2:
        raise ConfigError(f"algo.num_atoms must be >= 2 (got {algo.num_atoms})")
    if algo.batch_size <= 0 or algo.batch_size % env.num_envs:
        raise ConfigError(
            f"algo.batch_size={algo.batch_size} must be a positive multiple of env.num_envs="
            f"{env.num_envs} (the batch is sampled evenly across envs)"
        )
    if algo.buffer_size <= algo.n_step:
        raise ConfigError(
            f"algo.buffer_size={algo.buffer_size} (capacity per env) must exceed algo.n_step={algo.n_step}"
        )
    if algo.n_step < 1 or algo.num_updates < 1 or algo.policy_frequency < 1:
        raise ConfigError("algo.n_step, algo.num_updates and algo.policy_frequency must be >= 1")
    if not 0.0 < algo.gamma <= 1.0:
        raise ConfigError(f"algo.gamma must be in (0, 1] (got {algo.gamma})")
    if not 0.0 < algo.tau <= 1.0:
        raise ConfigError(f"algo.tau must be in (0, 1] (got {algo.tau})")
    widths = critic_adapted_widths(critic)  # None: the family has no adapters
    if widths is not None:
        limit = min(widths)
        if not 0 < critic.rank < limit:
            raise ConfigError(
                f"critic.rank={critic.rank} is out of range: use 0 < rank < {limit} "
                f"(the smallest adapted layer width)"
            )
