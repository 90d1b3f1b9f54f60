"""Run directory layout, metrics.jsonl, config.yaml, TensorBoard, W&B offline, progress output."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.runs import run_logger
from fast_lora_td3.runs.run_logger import RunLogger, make_run_dir

CONFIG = {"algo": {"gamma": 0.99, "dims": [256, 128]}, "env": {"task": "cartpole"}, "seed": 1}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class FakeClock:
    """Deterministic stand-in for time.monotonic."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(run_logger, "_now", fake)
    return fake


def test_make_run_dir_layout_and_collisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run_dir(tmp_path / "logs", "Mjlab-Cartpole", "lora")
    assert run.parent == tmp_path / "logs" / "Mjlab-Cartpole"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_lora", run.name)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "exported", "videos"]
    monkeypatch.setattr(run_logger, "_timestamp", lambda: "2025-01-02_03-04-05")
    names = [make_run_dir(tmp_path, "ALE/Pong-v5", "").name for _ in range(3)]
    assert names == ["2025-01-02_03-04-05", "2025-01-02_03-04-05_1", "2025-01-02_03-04-05_2"]
    assert (tmp_path / "ALE_Pong-v5" / names[2] / "checkpoints").is_dir()
    with pytest.raises(ConfigError, match="run_name"):
        make_run_dir(tmp_path, "t", "a/b")


def test_invalid_logger(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"logger must be one of tensorboard, wandb, none"):
        RunLogger(tmp_path, logger="mlflow", config={}, total_steps=10)


def test_metrics_jsonl_and_config(tmp_path: Path, clock: FakeClock) -> None:
    log = RunLogger(tmp_path, logger="none", config=CONFIG, total_steps=100, progress=False)
    log.log({"critic_loss": torch.tensor(0.5), "count": 3, "bad": float("nan")}, env_steps=10)
    clock.t += 2.5
    log.log({"critic_loss": 0.25, "flag": True}, env_steps=20)
    rows = _rows(tmp_path)  # readable before close: every line is flushed
    assert rows == [
        {"env_steps": 10, "wall_time_s": 0.0, "critic_loss": 0.5, "count": 3.0, "bad": None},
        {"env_steps": 20, "wall_time_s": 2.5, "critic_loss": 0.25, "flag": 1.0},
    ]
    with pytest.raises(TypeError, match="'vec' is not a scalar"):
        log.log({"vec": torch.ones(3)}, env_steps=30)
    log.close()
    log.close()  # idempotent
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == CONFIG
    assert not list(tmp_path.glob("events.out.tfevents.*"))  # logger=none: no TensorBoard


def test_tensorboard_events(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, config=CONFIG, total_steps=100, progress=False) as log:
        for step in (10, 20, 30):
            log.log({"episode_return": step / 10}, env_steps=step)
    assert list(tmp_path.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    events = acc.Scalars("episode_return")
    assert [(e.step, e.value) for e in events] == [(10, 1.0), (20, 2.0), (30, 3.0)]


def test_config_from_dataclass_and_changed_config_on_resume(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Cfg:
        lr: float = 1e-3
        dims: tuple[int, ...] = (4, 2)
        out: Path = Path("/x")

    RunLogger(tmp_path, logger="none", config=Cfg(), total_steps=1, progress=False).close()
    first = (tmp_path / "config.yaml").read_text()
    assert yaml.safe_load(first) == {"lr": 1e-3, "dims": [4, 2], "out": "/x"}
    RunLogger(tmp_path, logger="none", config=Cfg(), total_steps=1, progress=False).close()
    assert not (tmp_path / "config_resume_1.yaml").exists()  # same config: nothing new
    RunLogger(tmp_path, logger="none", config=Cfg(lr=5.0), total_steps=1, progress=False).close()
    assert (tmp_path / "config.yaml").read_text() == first  # the original is never overwritten
    assert yaml.safe_load((tmp_path / "config_resume_1.yaml").read_text())["lr"] == 5.0


def test_resume_appends_and_drops_rows_past_the_checkpoint(
    tmp_path: Path, clock: FakeClock
) -> None:
    with RunLogger(tmp_path, logger="none", config=CONFIG, total_steps=100, progress=False) as log:
        for step in (10, 20, 30):
            log.log({"r": step}, env_steps=step)
            clock.t += 1.0
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"env_steps": 40, "r"')  # a line cut short by a SIGKILL
    # Plain append (no resume_step): only the partial line goes.
    with RunLogger(tmp_path, logger="none", config=CONFIG, total_steps=100, progress=False) as log:
        log.log({"r": 40}, env_steps=40)
    assert [r["env_steps"] for r in _rows(tmp_path)] == [10, 20, 30, 40]
    # Resume from the checkpoint at step 20: rows logged after it are dropped, the clock continues.
    with RunLogger(
        tmp_path,
        logger="tensorboard",
        config=CONFIG,
        total_steps=100,
        progress=False,
        resume_step=20,
    ) as log:
        clock.t += 5.0
        log.log({"r": 30.5}, env_steps=30)
    rows = _rows(tmp_path)
    assert [(r["env_steps"], r["r"]) for r in rows] == [(10, 10.0), (20, 20.0), (30, 30.5)]
    assert rows[-1]["wall_time_s"] == pytest.approx(rows[1]["wall_time_s"] + 5.0)


def test_non_rank_zero_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "rank1"
    log = RunLogger(run, logger="tensorboard", config=CONFIG, rank=1, total_steps=10)
    log.log({"critic_loss": 1.0}, env_steps=5)
    log.update_progress(5, updates=3)
    log.close()
    assert not run.exists()
    assert capsys.readouterr().out == ""


def test_plain_progress_line(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    log = RunLogger(tmp_path, logger="none", config=CONFIG, total_steps=10_000, progress=True)
    log.update_progress(0, updates=0)
    assert capsys.readouterr().out == ""  # not a TTY: nothing until log()
    clock.t += 2.0
    log.update_progress(2000, updates=100, episode_return=12.5)
    log.log({"critic_loss": 0.125, "eval_return": 40.0}, env_steps=2000)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    # 2000 steps in 2 s = 1000 env-steps/s; 100 updates / 2 s = 50/s; 8000 steps left = 8 s.
    assert out[0] == (
        "2,000/10,000 (20.0%) | 1,000 env-steps/s | 50.0 upd/s | return 12.5 | "
        "eval 40 | critic loss 0.125 | ETA 0:00:08"
    )
    # Called every iteration, update_progress samples the clock at most every 0.25 s.
    for i in range(1000):
        log.update_progress(2000 + i)
    clock.t += 0.3
    log.update_progress(3000)
    assert len(log._samples) == 4
    log.close()
    quiet = RunLogger(tmp_path / "q", logger="none", config=CONFIG, total_steps=10, progress=False)
    quiet.log({"x": 1.0}, env_steps=1)
    quiet.close()
    assert capsys.readouterr().out == ""


def test_live_progress_on_a_tty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_logger, "_stdout_is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")  # rich truncates the line to the console width
    log = RunLogger(tmp_path, logger="none", config=CONFIG, total_steps=1000, progress=True)
    assert log._live is not None
    log.log({"critic_loss": 0.5}, env_steps=100)
    log.update_progress(200, episode_return=3.0)
    log.close()
    out = capsys.readouterr().out
    assert "env-steps/s" in out and "critic loss 0.5" in out and "return 3" in out


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import wandb  # noqa: F401
    except ImportError:
        pytest.skip("wandb is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    run = tmp_path / "run"
    with RunLogger(run, logger="wandb", config=CONFIG, total_steps=100, progress=False) as log:
        log.log({"episode_return": 1.5, "critic_loss": float("inf")}, env_steps=10)
    run_id = (run / "wandb_run_id").read_text().strip()
    offline = list((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline and any(offline[0].glob("*.wandb"))
    assert list(run.glob("events.out.tfevents.*"))  # TensorBoard is written too
    assert _rows(run)[0]["critic_loss"] is None and not math.isnan(_rows(run)[0]["episode_return"])


def test_wandb_missing_gives_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(
        ConfigError, match=r"logger=wandb needs the wandb package: pip install wandb"
    ):
        RunLogger(tmp_path, logger="wandb", config=CONFIG, total_steps=10, progress=False)
