"""The process launcher's environment (torchrun / Slurm srun variables).

Read by the simulators (Isaac Lab's AppLauncher starts in distributed mode under torchrun) and by
data-parallel training, so it sits below both.
"""

from __future__ import annotations

import os

__all__ = ["env_int", "world_size_from_environment"]


def env_int(*names: str, default: int) -> int:
    for name in names:
        if os.environ.get(name, "") != "":
            return int(os.environ[name])
    return default


def world_size_from_environment() -> int:
    """The world size torchrun (WORLD_SIZE) or srun (SLURM_STEP_NUM_TASKS) announces; 1 otherwise.

    SLURM_STEP_NUM_TASKS (not SLURM_NTASKS) is set by srun only, so a CLI started directly in a
    multi-task batch script runs as one process instead of waiting for ranks that never start.
    """
    return env_int("WORLD_SIZE", "SLURM_STEP_NUM_TASKS", default=1)
