"""Config validation before anything heavy starts: one clear line per mistake.

Each config dataclass checks its own fields (`check()`, also run by `__post_init__`); this module
adds the rules that relate two groups, and resolves the device.
"""

from __future__ import annotations

import torch

from fast_lora_td3.algos.config import ALGO_ONLY_KEYS
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.envs.factory import check_device
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.critic import critic_adapted_widths, validate_critic_config


def resolve_device(device: str) -> str:
    """`auto` → `cuda` when available else `cpu`; CUDA requested but absent is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device, key="device")
    return device


def resolve_runtime(cfg: TrainConfig, device: str | None = None, *, env_seed: bool = True) -> None:
    """Resolve, in place and in one place, the device of training and simulation (`device`, e.g. a
    data-parallel rank's, or else `cfg.device` with auto → cuda when available), the actor penalty
    weight (`AlgoConfig.preact_l2_weight`) and, with `env_seed`, the simulator seed (env.seed None
    → the top-level seed)."""
    cfg.device = resolve_device(cfg.device) if device is None else device
    cfg.env.device = cfg.device
    # The actor penalty in force goes into config.yaml and the checkpoints: a later change of its
    # default cannot change a resumed run.
    cfg.algo.actor_preact_l2 = cfg.algo.preact_l2_weight
    if env_seed:
        cfg.env.seed = simulator_seed(cfg)


def simulator_seed(cfg: TrainConfig) -> int:
    """The simulator's base seed (rank r seeds with it + r): `env.seed`, or the top-level `seed`
    when unset (the simulator follows the run's seed unless told otherwise)."""
    return cfg.seed if cfg.env.seed is None else cfg.env.seed


def check_batch_divides(batch_size: int, num_envs: int) -> None:
    """The batch is sampled evenly across envs, so it must be a positive multiple of num_envs."""
    if batch_size <= 0 or batch_size % num_envs:
        raise ConfigError(
            f"algo.batch_size={batch_size} must be a positive multiple of env.num_envs="
            f"{num_envs} (the batch is sampled evenly across envs)"
        )


def check_one_iteration(cfg: TrainConfig) -> None:
    """total_steps must cover one iteration (one step of every env; PPO: one rollout), or the run
    would train nothing and still export a policy and exit 0."""
    per_iteration = cfg.env.num_envs
    what = f"env.num_envs={cfg.env.num_envs}"
    if cfg.algo.name == "ppo":
        per_iteration *= cfg.ppo.num_steps_per_env
        what += f" x ppo.num_steps_per_env={cfg.ppo.num_steps_per_env}"
    if cfg.total_steps < per_iteration:
        raise ConfigError(
            f"total_steps={cfg.total_steps} is less than one iteration: use total_steps >= "
            f"{per_iteration} ({what} env steps)"
        )


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError on the first invalid setting of the final config (fields may have been
    changed after construction, e.g. by the CPU defaults, so every group is checked again)."""
    cfg.check()
    critic = cfg.critic
    validate_critic_config(critic)  # the family's own rules: its row of the critic table
    check_one_iteration(cfg)
    if cfg.algo.name == "ppo":
        return
    check_batch_divides(cfg.algo.batch_size, cfg.env.num_envs)
    widths = critic_adapted_widths(critic)  # None: the family has no adapters
    if widths is not None and not 0 < critic.rank < min(widths):
        raise ConfigError(
            f"critic.rank={critic.rank} is out of range: use 0 < rank < {min(widths)} "
            "(the smallest adapted layer width)"
        )


ALGO_LABELS = {"fasttd3": "FastTD3", "fastsac": "FastSAC"}
"""How the errors name each algorithm."""


def check_typed_algo_keys(name: str, typed: set[str]) -> None:
    """Refuse an `algo.` key typed on the command line that algorithm `name` does not read.

    Only typed keys count: a preset's FastTD3 keys under `algo=fastsac` are the preset's recipe,
    not the user's choice. PPO keeps its own rules (it ignores the off-policy keys)."""
    if name not in ALGO_ONLY_KEYS:
        return
    for owner, fields in ALGO_ONLY_KEYS.items():
        for key in (f"algo.{f}" for f in fields if owner != name):
            if key in typed:
                raise ConfigError(
                    f"{key} is a {ALGO_LABELS[owner]} setting: algo={name} does not read it; "
                    f"use algo={owner}, or drop it"
                )
