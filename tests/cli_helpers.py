"""Shared by the CLI-level tests: a tiny dummy-backend run and a subprocess runner for the CLI."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """Import `scripts/<name>.py` as module `name` (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


SMALL = [
    "env.backend=dummy",
    "env.task=PointMassAsym-v0",
    "env.num_envs=8",
    "device=cpu",
    "algo.batch_size=64",
    "algo.buffer_size=64",
    "algo.n_step=3",
    "algo.num_updates=2",
    "algo.num_atoms=21",
    "algo.learning_starts=4",
    "critic=simbav2_lora",
    "critic.width=32",
    "critic.num_blocks=1",
    "critic.rank=4",
    "actor.hidden_dims=[32,32]",
    "eval.num_envs=2",
    "eval.max_steps=10",
    "log_interval=5",
    "progress=false",
]
"""A seconds-long training run on the simulator-free point mass (SimbaV2-LoRA critic)."""

NO_EXPORT = [*SMALL, "export_at_end=false"]


def cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `python -m fast_lora_td3.cli ARGS` single-threaded and capture its output."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "fast_lora_td3.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
