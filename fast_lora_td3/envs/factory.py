"""``make_env``: validate an ``EnvConfig`` and build the selected backend from the backend table
(``envs.backends``). Backend modules are imported only when built, so importing this package never
pulls in a simulator (Isaac Lab must start its app before any ``isaaclab`` import).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

import torch

from fast_lora_td3.envs.backends import BACKEND_TABLE
from fast_lora_td3.envs.base import VecEnv, unknown_task_error
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError


def backend_class(backend: str) -> type:
    """Import and return the ``VecEnv`` class of a registered ``backend``."""
    spec = BACKEND_TABLE[backend]
    return getattr(importlib.import_module(spec.module), spec.cls)


def check_device(device: str, key: str = "env.device") -> torch.device:
    """Parse a device setting (`key` names it in errors); CUDA requested without CUDA is an error."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{key}={device!r} is not a device; use cpu, cuda or cuda:<i>") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={device!r} but CUDA is not available here; use {key}=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{key}={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    elif dev.type != "cpu":
        raise ConfigError(f"{key}={device!r} is not supported; use cpu, cuda or cuda:<i>")
    return dev


def check_backend_installed(backend: str) -> None:
    """Raise a ConfigError with the install command when the backend's package is missing."""
    spec = BACKEND_TABLE[backend]
    if importlib.util.find_spec(spec.package) is None:
        raise ConfigError(
            f"env.backend={backend!r} needs the '{spec.package}' package; "
            f"install it with: {spec.install_hint}"
        )


def validate_env_config(cfg: EnvConfig, check_runtime: bool = True) -> None:
    """Every check that needs no simulator: backend, num_envs, action_clip, episode length, render
    mode, and with `check_runtime` the device and the backend's package (skipped by dry runs that
    validate GPU / Isaac Lab command lines on other machines)."""
    cfg.check()
    if check_runtime:
        check_device(cfg.device)
        check_backend_installed(cfg.backend)


def make_env(cfg: EnvConfig) -> VecEnv:
    """Build the ``VecEnv`` selected by ``cfg.backend`` for ``cfg.task``."""
    validate_env_config(cfg)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=0)  # a standalone env without a run seed
    env_cls = check_task(cfg)
    return env_cls(cfg)


def check_task(cfg: EnvConfig) -> type:
    """The backend's adapter class, once `cfg.task` is one of its task ids (from the adapter's
    static `task_ids()`: nothing is built; Isaac Lab checks its ids itself when it starts)."""
    env_cls = backend_class(cfg.backend)
    task_ids = env_cls.task_ids()
    if task_ids is not None and cfg.task not in task_ids:
        raise unknown_task_error(cfg.backend, cfg.task, task_ids)
    return env_cls
