"""Vectorised environments behind one protocol (SPEC §4): mjlab, Isaac Lab, gymnasium.

Backends are imported lazily by ``make_env`` so that importing this package never pulls in a
simulator (Isaac Lab in particular must start its app before any ``isaaclab`` import).
"""

from fast_lora_td3.envs.base import EpisodeTracker, StepResult, VecEnv
from fast_lora_td3.envs.config import BACKENDS, EnvConfig
from fast_lora_td3.envs.factory import make_env, validate_env_config

__all__ = [
    "BACKENDS",
    "EnvConfig",
    "EpisodeTracker",
    "StepResult",
    "VecEnv",
    "make_env",
    "validate_env_config",
]
