"""fast_lora_td3: FastTD3 / FastSAC with SimbaV2-LoRA critics for massively parallel robot learning.

The stable entry points are importable from here (`from fast_lora_td3 import compose_config,
run_training`). They load on first use, so `import fast_lora_td3` pulls in neither torch nor a
simulator (Isaac Lab must start its app before any `isaaclab` import).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_ENTRY_POINTS = {
    # the commands: `fast-lora-td3 train|play|export|plot` and their config composition
    "main": "fast_lora_td3.cli",
    "compose_config": "fast_lora_td3.config.compose",
    "run_training": "fast_lora_td3.train",
    "run_play": "fast_lora_td3.deploy.play",
    "run_export": "fast_lora_td3.deploy.export",
    "plot_runs": "fast_lora_td3.runs.plot",
    # the typed configs every setting lives in
    "TrainConfig": "fast_lora_td3.config.schema",
    "AlgoConfig": "fast_lora_td3.algos.config",
    "CriticConfig": "fast_lora_td3.nn.config",
    "ActorConfig": "fast_lora_td3.nn.config",
    "EnvConfig": "fast_lora_td3.envs.config",
    # the user-facing errors (exit 2 / exit 1)
    "ConfigError": "fast_lora_td3.errors",
    "CheckpointError": "fast_lora_td3.errors",
    "NonFiniteError": "fast_lora_td3.errors",
    # the building blocks of a run, and the critic and backend extension points
    "make_env": "fast_lora_td3.envs.factory",
    "register_backend": "fast_lora_td3.envs.backends",
    "VecEnv": "fast_lora_td3.envs.base",
    "StepResult": "fast_lora_td3.envs.base",
    "make_learner": "fast_lora_td3.algos",
    "ReplayBuffer": "fast_lora_td3.replay.buffer",
    "Trainer": "fast_lora_td3.training.trainer",
    "export_policy": "fast_lora_td3.deploy.export",
    "LoRALinear": "fast_lora_td3.nn.lora",
    "build_critic": "fast_lora_td3.nn.critic",
    "register_critic_family": "fast_lora_td3.nn.critic",
}
"""Public name → the module that defines it (imported on first attribute access)."""

__all__ = ["__version__", *sorted(_ENTRY_POINTS)]


def __getattr__(name: str) -> Any:
    module = _ENTRY_POINTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fast_lora_td3' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENTRY_POINTS})
