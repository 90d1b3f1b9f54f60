"""The SB3 peer of `bench learn`: a rerun with the same seed gives the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")

from fast_lora_td3.bench.peers import run_sb3_peer


def test_same_seed_same_training_and_eval_return(tmp_path: Path) -> None:
    # Before the eval env was seeded, reruns trained alike but evaluated differently (the cpu
    # suite's HalfCheetah SB3 rows: same training returns, eval mean 2,514 then 2,438).
    rows = []
    for name in ("a", "b"):
        last = run_sb3_peer("sb3_td3", "Pendulum-v1", 3, 400, tmp_path / name, learning_starts=200)
        rows.append(last)
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["eval_return"] == last["eval_return"]
    assert rows[0]["eval_return"] == rows[1]["eval_return"]
    assert rows[0]["env_steps"] == rows[1]["env_steps"] == 400
