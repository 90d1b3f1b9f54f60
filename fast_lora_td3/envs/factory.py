"""``make_env``: validate an ``EnvConfig`` and build the selected backend (SPEC §4.2, §11)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Iterable

import torch

from fast_lora_td3.envs.base import VecEnv
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError

INSTALL_HINTS = {
    "mjlab": ("mjlab", "pip install mjlab"),
    "gymnasium": ("gymnasium", "pip install gymnasium"),
    "dummy": ("torch", "pip install torch"),
    "isaaclab": (
        "isaaclab",
        'pip install "isaaclab[isaacsim,all]==2.3.2.post1" --extra-index-url https://pypi.nvidia.com '
        "(on an NVIDIA GPU machine, with OMNI_KIT_ACCEPT_EULA=YES)",
    ),
}
"""backend → (importable module, install command)."""


def unknown_task_error(backend: str, task: str, valid: Iterable[str]) -> ConfigError:
    """A one-line ConfigError naming the unknown ``task`` and the closest registered ids."""
    valid = list(valid)
    close = difflib.get_close_matches(task, valid, n=5, cutoff=0.4)
    hint = f"did you mean one of {close}?" if close else f"{len(valid)} ids are registered"
    return ConfigError(f"env.task={task!r} is not a registered {backend} task; {hint}")


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
    module, command = INSTALL_HINTS[backend]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"env.backend={backend!r} needs the '{module}' package; install it with: {command}"
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
    """Build the ``VecEnv`` selected by ``cfg.backend`` for ``cfg.task``.

    Importing ``fast_lora_td3.tasks`` (done here for mjlab) registers our FastLoRA-* task ids.
    """
    validate_env_config(cfg)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=0)  # a standalone env without a run seed
    if cfg.backend == "dummy":
        from fast_lora_td3.envs.dummy import DUMMY_TASKS, PointMassEnv

        if cfg.task not in DUMMY_TASKS:
            raise unknown_task_error("dummy", cfg.task, DUMMY_TASKS)
        return PointMassEnv.from_config(cfg)
    if cfg.backend == "mjlab":
        from fast_lora_td3.envs.mjlab_env import MjlabVecEnv, mjlab_task_ids

        ids = mjlab_task_ids()
        if cfg.task not in ids:
            raise unknown_task_error("mjlab", cfg.task, ids)
        return MjlabVecEnv(cfg)
    if cfg.backend == "gymnasium":
        import gymnasium as gym

        from fast_lora_td3.envs.gym_env import GymVecEnv

        if cfg.task not in gym.registry:
            raise unknown_task_error("gymnasium", cfg.task, gym.registry.keys())
        return GymVecEnv(cfg)
    from fast_lora_td3.envs.isaaclab_env import IsaacLabVecEnv

    return IsaacLabVecEnv(cfg)
