"""Typed, documented environment config (Hydra structured config: unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass

from fast_lora_td3.envs.backends import BACKEND_TABLE
from fast_lora_td3.errors import ConfigError


@dataclass
class EnvConfig:
    """Which simulator and task to run, and how many copies."""

    backend: str = "mjlab"
    """Simulator: `mjlab` (default, CPU or CUDA), `isaaclab` (NVIDIA GPU), `gymnasium`, or `dummy`
    (a simulator-free point mass for tests and benchmarks: tasks `PointMass-v0`, `PointMassAsym-v0`);
    further backends register with `fast_lora_td3.register_backend` (table: `envs/backends.py`)."""
    task: str = "FastLoRA-Velocity-Flat-G1"
    """Registered task id of the backend (e.g. `Mjlab-Cartpole-Swingup`, `Isaac-Velocity-Flat-G1-v0`,
    `Pendulum-v1`)."""
    num_envs: int = 1024
    """Number of parallel environments (> 0)."""
    device: str = "cpu"
    """Simulator device: `cpu`, `cuda` or `cuda:<i>` (gymnasium always simulates on CPU and
    moves tensors to this device)."""
    seed: int | None = None
    """Seed of the simulator's random number generators (reset noise, randomisation, commands);
    None: the top-level `seed`. Rank r of a data-parallel run uses seed + r."""
    episode_length_s: float | None = None
    """Override of the task's episode length in seconds (mjlab / Isaac Lab); None keeps the task's."""
    randomize_episode_start: bool = False
    """Start each env's episode counter at a random step so time-outs are spread over time
    (decorrelated horizons; mjlab / Isaac Lab)."""
    video: bool = False
    """Render frames for video recording (turns on cameras in Isaac Lab, `rgb_array` rendering)."""
    render_mode: str | None = None
    """Render mode passed to the simulator (`rgb_array` or None); `video=true` implies `rgb_array`."""
    gym_vectorization_mode: str = "sync"
    """gymnasium only: `sync` (one process) or `async` (one subprocess per env)."""
    action_clip: float = 1.0
    """Actions are clamped to [-action_clip, action_clip] before the simulator applies its own
    action scale (mjlab / Isaac Lab). gymnasium maps [-1, 1] affinely onto the Box bounds."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every check that needs no simulator: backend, num_envs, action_clip, episode length and
        render mode (the device and the backend's package are checked when the env is made)."""
        if self.backend not in BACKEND_TABLE:
            raise ConfigError(
                f"env.backend={self.backend!r} is not valid; use one of {list(BACKEND_TABLE)}"
            )
        if not isinstance(self.num_envs, int) or self.num_envs <= 0:
            raise ConfigError(f"env.num_envs={self.num_envs!r} must be a positive integer")
        if not self.action_clip > 0:
            raise ConfigError(f"env.action_clip={self.action_clip!r} must be > 0")
        if self.episode_length_s is not None and not self.episode_length_s > 0:
            raise ConfigError(f"env.episode_length_s={self.episode_length_s!r} must be > 0 or null")
        if self.render_mode not in (None, "rgb_array"):
            raise ConfigError(
                f"env.render_mode={self.render_mode!r} is not valid; use null or 'rgb_array'"
            )
