"""Typed, documented environment config (Hydra structured config: unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass

from fast_lora_td3.envs.backends import BACKEND_TABLE
from fast_lora_td3.fields import check_fields, setting

GYM_VECTORIZATION_MODES = ("sync", "async")
"""Valid values of `EnvConfig.gym_vectorization_mode`."""


@dataclass
class EnvConfig:
    """Which simulator and task to run, and how many copies."""

    backend: str = setting("mjlab", choices=lambda: tuple(BACKEND_TABLE))
    """Simulator: `mjlab` (default, CPU or CUDA), `isaaclab` (NVIDIA GPU), `gymnasium`, or `dummy`
    (a simulator-free point mass for tests and benchmarks: tasks `PointMass-v0`, `PointMassAsym-v0`);
    further backends register with `fast_lora_td3.register_backend` (table: `envs/backends.py`)."""
    task: str = setting(
        "FastLoRA-Velocity-Flat-G1", free="checked by the backend when the env is made"
    )
    """Registered task id of the backend (e.g. `Mjlab-Cartpole-Swingup`, `Isaac-Velocity-Flat-G1-v0`,
    `Pendulum-v1`)."""
    num_envs: int = setting(1024, ge=1)
    """Number of parallel environments (> 0)."""
    device: str = setting("cpu", pattern=r"cpu|cuda(:\d+)?", what="cpu, cuda or cuda:<i>")
    """Simulator device: `cpu`, `cuda` or `cuda:<i>` (gymnasium always simulates on CPU and
    moves tensors to this device)."""
    seed: int | None = setting(None, ge=0, lt=2**32)
    """Seed of the simulator's random number generators (reset noise, randomisation, commands);
    None: the top-level `seed`. Rank r of a data-parallel run uses seed + r."""
    episode_length_s: float | None = setting(None, gt=0)
    """Override of the task's episode length in seconds (mjlab / Isaac Lab); None keeps the task's."""
    randomize_episode_start: bool = False
    """Start each env's episode counter at a random step so time-outs are spread over time
    (decorrelated horizons; mjlab / Isaac Lab)."""
    video: bool = False
    """Render frames for video recording (turns on cameras in Isaac Lab, `rgb_array` rendering)."""
    render_mode: str | None = setting(None, choices=("rgb_array",))
    """Render mode passed to the simulator (`rgb_array` or None); `video=true` implies `rgb_array`."""
    gym_vectorization_mode: str = setting("sync", choices=GYM_VECTORIZATION_MODES)
    """gymnasium only: `sync` (one process) or `async` (one subprocess per env)."""
    action_clip: float = setting(1.0, gt=0)
    """Actions are clamped to [-action_clip, action_clip] before the simulator applies its own
    action scale (mjlab / Isaac Lab). gymnasium maps [-1, 1] affinely onto the Box bounds."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every field against its declared valid values (no simulator needed); whether the device
        exists and the backend's package is installed is checked when the env is made."""
        check_fields(self, "env")
