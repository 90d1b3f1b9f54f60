"""`play` records video where the simulator renders (mjlab offscreen via EGL) and says so where not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import NO_EXPORT as SMALL
from cli_helpers import cli


@pytest.mark.mjlab
def test_play_records_mjlab_video(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MUJOCO_GL="egl")
    base = [sys.executable, "-m", "fast_lora_td3.cli"]
    train = subprocess.run(
        [
            *base,
            "train",
            "experiment=cartpole_cpu",
            "env.num_envs=4",
            "algo.batch_size=16",
            "algo.buffer_size=32",
            "total_steps=80",
            "eval.num_envs=1",
            "eval.max_steps=5",
            "export_at_end=false",
            "progress=false",
            f"run_dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-2000:]
    play = subprocess.run(
        [*base, "play", f"checkpoint={run_dir}", "env.video=true", "video_length=3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert play.returncode == 0, play.stderr[-2000:]
    video = run_dir / "videos" / "play_torch.mp4"
    assert video.exists() and video.stat().st_size > 1000, play.stdout


def test_play_video_on_a_backend_without_renderer_is_a_clear_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok = cli("train", *SMALL, "total_steps=80", f"run_dir={run_dir}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    r = cli("play", f"checkpoint={run_dir}", "env.video=true", cwd=tmp_path)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "video" in lines[0] and "Traceback" not in r.stderr
