"""The training loop on the simulator-free dummy backend: resume, preemption, NaN guard, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import NO_EXPORT as SMALL
from cli_helpers import cli

from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.validate import resolve_runtime
from fast_lora_td3.envs import make_env
from fast_lora_td3.envs.base import StepResult
from fast_lora_td3.errors import NonFiniteError
from fast_lora_td3.runs.checkpoint import CheckpointManager
from fast_lora_td3.training import metrics_window
from fast_lora_td3.training.finite_guard import FiniteGuard
from fast_lora_td3.training.metrics_window import MetricsWindow
from fast_lora_td3.training.trainer import PREEMPT_EXIT_CODE, Trainer


def run_trainer(run_dir: Path, total_steps: int, resume: bool = False) -> Trainer:
    cfg = compose_config([*SMALL, f"total_steps={total_steps}", "save_replay=true"])
    trainer = Trainer(cfg, run_dir)
    if resume:
        trainer.load_checkpoint()
    trainer.train()
    trainer.close()
    return trainer


@pytest.mark.parametrize("env_seed", [None, 3])
def test_trainer_seeds_the_simulator_as_the_train_command(
    env_seed: int | None, tmp_path: Path
) -> None:
    """A Trainer built from an unresolved config (as tests build it) gives rank r's simulator the
    seed that `train`'s resolve_runtime gives it: env.seed, else the run's seed, plus r."""
    cfg = compose_config(
        [*SMALL, "seed=11", f"env.seed={'null' if env_seed is None else env_seed}"]
    )
    seeds = []

    def recording_factory(env_cfg):
        seeds.append(env_cfg.seed)
        return make_env(env_cfg)

    Trainer(cfg, tmp_path, env_factory=recording_factory, rank=2).close()
    resolve_runtime(cfg, "cpu")
    assert seeds == [cfg.env.seed + 2] == [(11 if env_seed is None else env_seed) + 2]


def test_resume_gives_identical_parameters_and_optimizer_state(tmp_path: Path) -> None:
    straight = run_trainer(tmp_path / "a", total_steps=8 * 30)
    run_trainer(tmp_path / "b", total_steps=8 * 15)
    resumed = run_trainer(tmp_path / "b", total_steps=8 * 30, resume=True)
    assert resumed.iteration == straight.iteration == 30
    for name, module in straight.learner.modules().items():
        other = resumed.learner.modules()[name].state_dict()
        for key, value in module.state_dict().items():
            assert torch.equal(value, other[key]), f"{name}.{key} differs after resume"
    for name, opt in straight.learner.optimizers().items():
        a, b = opt.state_dict()["state"], resumed.learner.optimizers()[name].state_dict()["state"]
        assert a.keys() == b.keys()
        for idx in a:
            for key in a[idx]:
                assert torch.equal(torch.as_tensor(a[idx][key]), torch.as_tensor(b[idx][key])), (
                    f"{name} state {idx}.{key} differs"
                )
    rows = [
        json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and len(steps) == len(set(steps))


def test_nan_guard_names_tensor_and_saves_debug_checkpoint(tmp_path: Path) -> None:
    cfg = compose_config([*SMALL, "total_steps=800", "nan_check_interval=5"])
    trainer = Trainer(cfg, tmp_path)
    step = trainer.env.step

    def poisoned(actions: torch.Tensor):
        result = step(actions)
        if trainer.iteration >= 7:
            result.reward[0] = float("nan")
        return result

    trainer.env.step = poisoned
    with pytest.raises(NonFiniteError, match="rewards") as info:
        trainer.train()
    assert info.value.step == 10 * 8
    assert list((tmp_path / "checkpoints").glob("debug_*.pt"))
    trainer.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_metrics_window_means_schedule_and_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(metrics_window, "time", clock)
    window = MetricsWindow(log_interval=5, log_interval_s=0.5, num_envs=4, poll_s=1.0)
    window.start(10)
    for critic, actor in ((1.0, 2.0), (2.0, None), (6.0, 4.0)):
        update = {"critic_loss": torch.tensor(critic), "q_mean": torch.tensor(-critic)}
        if actor is not None:
            update["actor_loss"] = torch.tensor(actor)
        window.add(update)
    assert window.means() == {"critic_loss": 3.0, "q_mean": -3.0, "actor_loss": 3.0}
    assert list(window.losses()) == ["critic_loss", "actor_loss"]
    # Rows: every log_interval iterations, when forced, or after log_interval_s seconds.
    assert window.due(15, 100.1) and not window.due(14, 100.1)
    assert window.due(14, 100.1, force=True) and window.due(14, 100.5)
    # First-episode polling: at most every poll_s seconds, and never once an episode is logged.
    assert not window.poll_due(100.5) and window.poll_due(101.0) and not window.poll_due(101.5)
    window.episode_logged = True
    assert not window.poll_due(105.0)
    window.timings.update(env=1.0, sample=1.0, update=2.0)
    assert window.time_fractions() == {
        "time/env_frac": 0.25,
        "time/sample_frac": 0.25,
        "time/update_frac": 0.5,
    }
    clock.now = 102.0  # 2 s for 8 iterations of 4 envs and 3 critic updates
    assert window.close(18) == {"env_steps_per_s": 16.0, "updates_per_s": 1.5}
    assert window.means() == {} and window.rows == 1 and window.start_iteration == 18
    assert set(window.time_fractions().values()) == {0.0}  # no time yet: no division by zero
    assert not window.due(19, 102.4) and window.due(19, 102.5)  # the clock restarted at close


def _step(reward: float) -> StepResult:
    obs = torch.zeros(4, 2)
    done = torch.zeros(4, dtype=torch.bool)
    return StepResult(obs, obs, torch.full((4,), reward), done, done, obs, obs)


def test_finite_guard_skip_stop_and_debug_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cpu = torch.device("cpu")
    guard = FiniteGuard(2, "skip", 4, cpu, checkpoints=None, state=dict)
    guard.observe(1, _step(float("nan")), dict)  # flagged on the device, read at iteration 2
    assert capsys.readouterr().out == ""
    guard.observe(2, _step(0.0), dict)
    assert (
        "non-finite values in 'rewards' at env step 8 (nan_action=skip" in capsys.readouterr().out
    )
    guard.observe(3, _step(0.0), dict)
    guard.observe(4, _step(0.0), dict)  # the flags were reset after the check
    assert capsys.readouterr().out == ""

    nan_loss = {"critic_loss": torch.tensor(float("nan"))}
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=1)
    stop = FiniteGuard(3, "stop", 4, cpu, checkpoints=manager, state=lambda: {"step": 3})
    stop.observe(2, _step(0.0), lambda: nan_loss)  # not a check iteration: losses not read
    with pytest.raises(NonFiniteError, match="'critic_loss' at env step 12") as info:
        stop.observe(3, _step(0.0), lambda: nan_loss)
    assert info.value.step == 12
    assert torch.load(manager.debug_path_for(3), weights_only=True) == {"step": 3}
    other_rank = FiniteGuard(1, "stop", 4, cpu, checkpoints=None, state=dict)
    with pytest.raises(NonFiniteError, match="rewards"):
        other_rank.observe(1, _step(float("inf")), dict)
    off = FiniteGuard(0, "stop", 4, cpu, checkpoints=manager, state=dict)
    off.observe(5, _step(float("nan")), lambda: nan_loss)  # nan_check_interval=0: never checks
    names = sorted(p.name for p in manager.directory.iterdir())
    assert names == ["debug_000000000003.pt", "debug_000000000003.pt.sha256"]


def test_sigterm_checkpoints_and_resume_continues(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*SMALL, "total_steps=10000000", f"run_dir={run_dir}", "checkpoint_interval=0"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fast_lora_td3.cli", "train", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and not (
        metrics.exists() and metrics.read_text().count("\n") >= 2
    ):
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPT_EXIT_CODE, err
    assert "Traceback" not in err
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts, "SIGTERM must leave a checkpoint"
    state = torch.load(ckpts[-1], weights_only=True)
    stopped_at = state["env_steps"]
    assert stopped_at > 0
    total = stopped_at + 8 * 10
    done = cli("train", *args[:-2], f"total_steps={total}", f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"resumed {run_dir} at env step {stopped_at}" in done.stdout
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["env_steps"] == total


BAD_INPUTS = [
    (["env.task=NoSuchTask-v9"], "env.task"),
    (["algo.nonexistent=1"], "nonexistent"),
    (["env.num_envs=abc"], "env.num_envs"),
    (["env.num_envs=0"], "env.num_envs"),
    (["critic.rank=64"], "critic.rank"),
    (["critic.rank=0"], "critic.rank"),
    (["algo.batch_size=60"], "algo.batch_size"),
    (["algo.v_min=5", "algo.v_max=1"], "algo.v_min"),
    (["device=cuda"], "device"),
    (["--bogus"], "--bogus"),
]


@pytest.mark.parametrize(("overrides", "needle"), BAD_INPUTS)
def test_bad_input_is_one_line_without_traceback(
    tmp_path: Path, overrides: list[str], needle: str
) -> None:
    result = cli("train", *SMALL, "total_steps=80", *overrides, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in lines[0]


def test_corrupt_and_mismatched_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok = cli("train", *SMALL, "total_steps=80", f"run_dir={run_dir}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    mismatch = cli(
        "train", *SMALL, "total_steps=160", f"run_dir={run_dir}", "algo.gamma=0.9", cwd=tmp_path
    )
    assert mismatch.returncode == 2
    assert "algo.gamma" in mismatch.stderr and "Traceback" not in mismatch.stderr
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint" * 100)
    corrupt = cli("play", f"checkpoint={garbage}", cwd=tmp_path)
    assert corrupt.returncode == 2
    assert str(garbage) in corrupt.stderr and "Traceback" not in corrupt.stderr
    missing = cli("export", f"checkpoint={tmp_path / 'nope.pt'}", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_plot_writes_png_for_two_runs(tmp_path: Path) -> None:
    dirs = []
    for seed in (1, 2):
        d = tmp_path / f"run{seed}"
        r = cli("train", *SMALL, "total_steps=160", f"seed={seed}", f"run_dir={d}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        dirs.append(str(d))
    out = tmp_path / "curves.png"
    r = cli("plot", *dirs, "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000


def test_ppo_baseline_writes_same_run_layout_and_plots_with_td3(tmp_path: Path) -> None:
    ppo_dir, td3_dir = tmp_path / "ppo", tmp_path / "td3"
    ppo = cli(
        "train",
        "algo=ppo",
        "env.backend=dummy",
        "env.task=PointMass-v0",
        "env.num_envs=8",
        "device=cpu",
        "ppo.num_steps_per_env=8",
        "total_steps=640",
        "log_interval=2",
        "eval.num_envs=2",
        "eval.max_steps=10",
        "progress=false",
        f"run_dir={ppo_dir}",
        cwd=tmp_path,
    )
    assert ppo.returncode == 0, ppo.stderr
    rows = [json.loads(x) for x in (ppo_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 640
    assert "critic_loss" in rows[-1] and "eval_return" in rows[-1]
    assert (ppo_dir / "config.yaml").exists() and list((ppo_dir / "checkpoints").iterdir())
    td3 = cli("train", *SMALL, "total_steps=160", f"run_dir={td3_dir}", cwd=tmp_path)
    assert td3.returncode == 0, td3.stderr
    out = tmp_path / "both.png"
    r = cli("plot", str(ppo_dir), str(td3_dir), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000


def test_dry_run_rejects_a_bad_compile_flag(tmp_path: Path) -> None:
    result = cli("train", *SMALL, "dry_run=true", "compile=maybe", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "compile=auto" in lines[0], result.stderr


def test_max_wall_s_ends_the_run_like_total_steps(tmp_path: Path) -> None:
    """A time budget stops early, then evaluates, checkpoints and logs the last row as at
    total_steps."""
    cfg = compose_config([*SMALL, "total_steps=80000000", "max_wall_s=1.5"])
    trainer = Trainer(cfg, tmp_path)
    row = trainer.train()
    trainer.close()
    assert 0 < trainer.iteration < trainer.iterations
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert "eval_return" in row and last["env_steps"] == trainer.env_steps
    steps = [step for step, _ in CheckpointManager(tmp_path / "checkpoints", 3).checkpoints()]
    assert steps and steps[-1] == trainer.env_steps  # the last iteration was checkpointed
