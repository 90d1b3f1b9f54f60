"""plot_runs writes a PNG of the curves of several runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.runs.plot import plot_runs, read_metrics, series

C0 = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's first two default line colours
C1 = np.array([0xFF, 0x7F, 0x0E]) / 255


def _run(root: Path, name: str, rows: list[dict]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run / "metrics.jsonl").write_text(text + '{"env_steps": 99')  # plus a line cut by a kill
    return run


def _has_colour(img: np.ndarray, colour: np.ndarray) -> bool:
    return bool((np.abs(img[..., :3] - colour).max(axis=-1) < 0.02).sum() > 50)


def test_two_runs_all_keys(tmp_path: Path) -> None:
    a = _run(
        tmp_path,
        "2025-01-01_00-00-00_lora",
        [
            {
                "env_steps": s,
                "episode_return": s / 100,
                "critic_loss": 1 / (1 + s),
                "eval_return": 0,
            }
            for s in range(0, 5000, 250)
        ],
    )
    b = _run(
        tmp_path,
        "2025-01-01_00-00-00_dense",
        [
            {"env_steps": s, "episode_return": math.sqrt(s), "critic_loss": None, "eval_return": 1}
            for s in range(0, 5000, 500)
        ],
    )
    out = plot_runs([a, b], tmp_path / "out" / "curves.png")
    assert out.stat().st_size > 20_000
    img = imread(out)
    assert img.shape == (400, 3 * 500, 4)  # one 500x400 panel per key
    assert _has_colour(img, C0) and _has_colour(img, C1)  # both runs were drawn


def test_run_with_only_some_keys(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", [{"env_steps": s, "episode_return": s} for s in range(10)])
    b = _run(
        tmp_path, "b", [{"env_steps": s, "critic_loss": 1.0 / (s + 1)} for s in range(0, 10, 2)]
    )
    out = plot_runs([a, b], tmp_path / "p.png")
    img = imread(out)
    assert img.shape == (400, 2 * 500, 4)  # eval_return is in neither run: its panel is skipped
    # Only run "a" draws on the first panel, only run "b" on the second.
    assert _has_colour(img[:, :500], C0) and not _has_colour(img[:, :500], C1)
    assert _has_colour(img[:, 500:], C1) and not _has_colour(img[:, 500:], C0)


def test_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no metrics.jsonl in .*empty"):
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
    run = _run(tmp_path, "r", [{"env_steps": 1, "actor_loss": 0.5}])
    with pytest.raises(ConfigError, match="available keys: actor_loss"):
        plot_runs([run], tmp_path / "x.png")
    with pytest.raises(ConfigError, match="at least one run"):
        plot_runs([], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_series_sorts_dedupes_and_drops_missing(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        "r",
        [
            {"env_steps": 20, "x": 2.0},
            {"env_steps": 10, "x": 1.0},
            {"env_steps": 30, "x": None},
            {"env_steps": 20, "x": 5.0},  # a resumed run re-logged step 20: the last one wins
            {"env_steps": 40},
        ],
    )
    rows = read_metrics(run)
    assert len(rows) == 5  # the cut line is skipped
    assert series(rows, "x") == ([10, 20], [1.0, 5.0])
    assert series(rows, "y") == ([], [])
