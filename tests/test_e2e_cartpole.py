"""End-to-end: the `cartpole_cpu` preset, shortened, trains mjlab cartpole swing-up through the CLI.

A random policy scores about 8.7 on this task (eval returns are deterministic-policy returns over a
1000-step episode, maximum about 50) and the untrained deterministic policy about 4-7. The run must
reach an eval return of at least 25 — three times random — at one of its evaluations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RANDOM_POLICY_RETURN = 8.7
"""Mean return of uniform random actions (measured: 8.67 ± 2.5 over 64 envs, one episode each)."""


@pytest.mark.mjlab
@pytest.mark.slow
def test_cartpole_cpu_learns_through_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MUJOCO_GL="egl")
    cmd = [
        sys.executable,
        "-m",
        "fast_lora_td3.cli",
        "train",
        "experiment=cartpole_cpu",
        "total_steps=320000",
        "eval.interval=64000",
        f"run_dir={run_dir}",
        "progress=false",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 320000
    assert {"env_steps", "wall_time_s", "critic_loss", "episode_return"} <= set().union(*rows)
    evals = [r["eval_return"] for r in rows if "eval_return" in r]
    assert len(evals) == 5, evals
    assert (run_dir / "config.yaml").exists()
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert (run_dir / "exported" / "policy.onnx").exists()
    assert max(evals) >= 3 * RANDOM_POLICY_RETURN - 1.0, evals
