"""Vectorised environments behind one protocol: mjlab, Isaac Lab, gymnasium and a dummy.

Backends are imported lazily by ``make_env`` so that importing this package never pulls in a
simulator (Isaac Lab in particular must start its app before any ``isaaclab`` import).
"""

from fast_lora_td3.envs.backends import BACKEND_TABLE, BackendSpec, backend_names, register_backend
from fast_lora_td3.envs.base import EpisodeTracker, StepResult, VecEnv
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.envs.factory import make_env, validate_env_config

__all__ = [
    "BACKEND_TABLE",
    "BackendSpec",
    "EnvConfig",
    "EpisodeTracker",
    "StepResult",
    "VecEnv",
    "backend_names",
    "make_env",
    "register_backend",
    "validate_env_config",
]
