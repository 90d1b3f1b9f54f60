"""Typed configs of `bench update` and `bench replay`, built from the training schema.

The network and algorithm settings are the training dataclasses (AlgoConfig, CriticConfig,
ActorConfig, so their checks apply); the rest are the benchmark's own knobs. Words are `key=value`
as in `train`; the short keys of earlier releases (`batch_size`, `critic`, `num_atoms`, …) stay as
aliases, and a list may be written `16,16` as well as `[16,16]`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import OmegaConf

from fast_lora_td3.algos.config import AlgoConfig, check_choice
from fast_lora_td3.config.schema import AMP_MODES
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import ActorConfig, CriticConfig

__all__ = [
    "IMPLS",
    "MODES",
    "ReplayBenchConfig",
    "UpdateBenchConfig",
    "flat_defaults",
    "parse_bench_config",
]

MODES = ("eager", "compiled", "graphed", "graphed_eager", "reduce_overhead")
"""`bench update modes=`: how the update step runs (see bench/update.py)."""
IMPLS = ("fast", "reference")
"""`bench update impls=`: the code as it is, or the pre-issue-10 update (a speed A/B)."""


def _comma_list(key: str, text: str, valid: tuple[str, ...]) -> list[str]:
    items = [m for m in text.split(",") if m]
    if not items or any(m not in valid for m in items):
        raise ConfigError(f"bench: {key}={text!r}: use a comma list of {', '.join(valid)}")
    return items


@dataclass
class UpdateBenchConfig:
    """`bench update`: critic updates of one recipe, timed per mode and implementation."""

    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig(batch_size=8192, buffer_size=32))
    """Algorithm (name, batch, n-step, atoms, …); the replay holds `buffer_size` random steps."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Critic family and sizes; a LoRA family is timed beside its dense twin (`compare_dense`)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Actor network."""
    obs_dim: int = 123
    """Observation size (G1 flat velocity task)."""
    critic_obs_dim: int = 0
    """Critic observation size (0: the critic sees `obs_dim`)."""
    action_dim: int = 37
    """Action size."""
    num_envs: int = 1024
    """Environments of the replay buffer (the batch is sampled evenly across them)."""
    amp: str = "none"
    """`none` or `bf16` autocast, as `train amp=`."""
    device: str = "auto"
    """`cpu`, `cuda`, `cuda:N` or `auto`."""
    modes: str = "eager"
    """Comma list of MODES."""
    iters: int = 20
    """Timed updates per round."""
    warmup: int = 3
    """Untimed updates before the first round (at least policy_frequency)."""
    compare_dense: bool = True
    """Also time the dense twin of a LoRA family and report `lora_overhead`."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    seed: int = 0
    """Seed of the networks' initialisation."""
    rounds: int = 1
    """Rounds that alternate every timed configuration (medians are reported)."""
    impls: str = "fast"
    """Comma list of IMPLS."""

    def __post_init__(self) -> None:
        check_choice("algo", self.algo.name, ("fasttd3", "fastsac"))
        check_choice("amp", self.amp, AMP_MODES)
        _comma_list("modes", self.modes, MODES)
        _comma_list("impls", self.impls, IMPLS)
        for key in ("obs_dim", "action_dim", "num_envs", "iters", "rounds"):
            if getattr(self, key) < 1:
                raise ConfigError(f"bench: {key}={getattr(self, key)} must be >= 1")
        for key in ("critic_obs_dim", "warmup", "threads", "seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"bench: {key}={getattr(self, key)} must be >= 0")

    @property
    def mode_list(self) -> list[str]:
        """`modes` as a list."""
        return _comma_list("modes", self.modes, MODES)

    @property
    def impl_list(self) -> list[str]:
        """`impls` as a list."""
        return _comma_list("impls", self.impls, IMPLS)


@dataclass
class ReplayBenchConfig:
    """`bench replay`: bytes per transition and `sample_nstep` throughput of one buffer."""

    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig(batch_size=8192, buffer_size=256))
    """Batch, capacity per env, n-step and the storage dtypes (`replay_obs_dtype`, …)."""
    obs_dim: int = 123
    """Observation size."""
    critic_obs_dim: int = 0
    """Critic observation size (0: none stored)."""
    action_dim: int = 37
    """Action size."""
    num_envs: int = 1024
    """Environments writing the buffer."""
    max_episode_length: int = 1000
    """Episode time-out in steps (sizes the truncation side table)."""
    device: str = "auto"
    """`cpu`, `cuda`, `cuda:N` or `auto`."""
    iters: int = 50
    """Timed samples."""
    warmup: int = 5
    """Untimed samples first."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""

    def __post_init__(self) -> None:
        for key in ("obs_dim", "action_dim", "num_envs", "max_episode_length", "iters"):
            if getattr(self, key) < 1:
                raise ConfigError(f"bench: {key}={getattr(self, key)} must be >= 1")
        for key in ("critic_obs_dim", "warmup", "threads"):
            if getattr(self, key) < 0:
                raise ConfigError(f"bench: {key}={getattr(self, key)} must be >= 0")


# Short keys of the benchmark command line → the schema's dotted keys.
ALIASES = {
    "algo": "algo.name",
    "critic": "critic.family",
    "batch_size": "algo.batch_size",
    "buffer_size": "algo.buffer_size",
    "n_step": "algo.n_step",
    "num_atoms": "algo.num_atoms",
    "policy_frequency": "algo.policy_frequency",
    "obs_dtype": "algo.replay_obs_dtype",
    "action_dtype": "algo.replay_action_dtype",
    "mode": "modes",
}
_UPDATE_SHORT = ("algo", "critic", "batch_size", "buffer_size", "n_step", "num_atoms")
_UPDATE_SHORT += ("policy_frequency", "mode")
_REPLAY_SHORT = ("batch_size", "buffer_size", "n_step", "obs_dtype", "action_dtype")
_SHORT = {UpdateBenchConfig: _UPDATE_SHORT, ReplayBenchConfig: _REPLAY_SHORT}

Config = TypeVar("Config", UpdateBenchConfig, ReplayBenchConfig)


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def flat_defaults(schema: type[Config]) -> dict[str, Any]:
    """Every key `schema` takes (dotted) with its default."""
    return _leaves(OmegaConf.to_container(OmegaConf.structured(schema)))  # type: ignore[arg-type]


def parse_bench_config(words: list[str], schema: type[Config]) -> tuple[Config, set[str]]:
    """`key=value` words over `schema`'s defaults; returns the config and the dotted keys given.
    An unknown key, a word without `=`, or a bad value is a one-line ConfigError."""
    known = flat_defaults(schema)
    dotlist, given = [], set()
    for word in words:
        key, sep, value = word.partition("=")
        key = key.lstrip("+")
        key = ALIASES.get(key, key) if key in _SHORT[schema] or key == "mode" else key
        if not sep or key not in known:
            top = [k for k in known if "." not in k]
            groups = sorted({f"{k.split('.')[0]}.*" for k in known if "." in k})
            raise ConfigError(
                f"bench: bad argument {word!r}: use key=value with key one of "
                f"{', '.join([*_SHORT[schema], *top, *groups])} (the training config's fields)"
            )
        if isinstance(known[key], list) and not value.lstrip().startswith("["):
            value = f"[{value}]"  # `16,16` as well as `[16,16]`
        dotlist.append(f"{key}={value}")
        given.add(key)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(dotlist))
        cfg = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf type errors: one line, no traceback
        msg = " ".join(str(exc).split("\n")[0].split())
        where = getattr(exc, "full_key", None)
        raise ConfigError(f"bench: bad value{f' of {where}' if where else ''}: {msg}") from None
    return cfg, given  # type: ignore[return-value]


def with_family(critic: CriticConfig, family: str, given: set[str]) -> CriticConfig:
    """`critic` with another family (the dense twin of a LoRA family); unless the command line set
    `critic.lora_layers`, mlp_lora adapts `hidden` and simbav2_lora `blocks`."""
    if "critic.lora_layers" in given:
        return dataclasses.replace(critic, family=family)
    layers = ["hidden"] if family == "mlp_lora" else ["blocks"]
    return dataclasses.replace(critic, family=family, lora_layers=layers)
