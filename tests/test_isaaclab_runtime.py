"""Isaac Lab process life cycle without Isaac Sim: AppLauncher arguments, task ids, the 3.0 guard,
closing the Kit app last with the right exit code, and evaluation on a slice of the one env."""

from __future__ import annotations

import os
import sys
import threading
import types
from pathlib import Path

import pytest
import torch
from cli_helpers import NO_EXPORT
from isaaclab_stand_in import N, StandInApp, StandInEnv

import fast_lora_td3.cli as cli
import fast_lora_td3.envs.isaaclab_env as il
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.envs import EnvConfig
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.tasks.isaaclab_g1 import ISAACLAB_TASK_IDS, check_isaaclab_version
from fast_lora_td3.training.trainer import Trainer


def test_app_launcher_kwargs_follow_isaaclab_train_script() -> None:
    cfg = EnvConfig(backend="isaaclab", device="cuda:1")
    assert il.app_launcher_kwargs(cfg, 1) == {
        "headless": True,
        "device": "cuda:1",
        "enable_cameras": False,
    }
    assert il.app_launcher_kwargs(EnvConfig(video=True), 1)["enable_cameras"]
    # render() raises without cameras: rgb_array rendering alone must turn them on.
    assert il.app_launcher_kwargs(EnvConfig(render_mode="rgb_array"), 1)["enable_cameras"]
    assert il.app_launcher_kwargs(cfg, 4)["distributed"] is True


def test_task_ids_with_and_without_v0() -> None:
    registry = {"Isaac-Velocity-Flat-G1-v0": 1, "Isaac-Velocity-Rough-G1": 1}
    assert il.resolve_task_id("Isaac-Velocity-Flat-G1", registry) == "Isaac-Velocity-Flat-G1-v0"
    assert il.resolve_task_id("Isaac-Velocity-Flat-G1-v0", registry) == "Isaac-Velocity-Flat-G1-v0"
    assert il.resolve_task_id("Isaac-Velocity-Rough-G1-v0", registry) == "Isaac-Velocity-Rough-G1"
    assert il.resolve_task_id("Isaac-Nope", registry) is None


def test_fastlora_task_refused_on_isaaclab_3() -> None:
    task = next(iter(ISAACLAB_TASK_IDS))
    check_isaaclab_version(task, (2, 3))
    check_isaaclab_version("Isaac-Velocity-Flat-G1", (3, 0))  # stock tasks are fine on 3.0
    with pytest.raises(ConfigError, match=r"needs Isaac Lab 2\.3"):
        check_isaaclab_version(task, (3, 0))


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@pytest.fixture
def kit(monkeypatch: pytest.MonkeyPatch) -> StandInApp:
    """A started 'Kit app' and an os._exit that raises instead of ending pytest."""
    app = StandInApp()
    monkeypatch.setattr(il, "_APP", app)

    def fake_exit(code: int) -> None:
        raise _Exit(code)

    monkeypatch.setattr(il.os, "_exit", fake_exit)
    return app


def _pending_watchdogs() -> list[threading.Timer]:
    return [
        t
        for t in threading.enumerate()
        if isinstance(t, threading.Timer) and not t.finished.is_set()
    ]


def test_finish_closes_app_only_after_success(kit: StandInApp) -> None:
    with pytest.raises(_Exit) as exc:
        il.finish_simulation_app(0)
    assert exc.value.code == 0 and kit.closed == 1 and il._APP is None
    assert _pending_watchdogs() == []  # close() returned: its watchdog must not fire later


def test_finish_never_turns_a_failure_into_exit_0(kit: StandInApp) -> None:
    with pytest.raises(_Exit) as exc:
        il.finish_simulation_app(3)
    assert exc.value.code == 3 and kit.closed == 0  # close() could exit 0 or hang: skipped


def test_finish_keeps_exit_code_when_close_raises_systemexit(kit: StandInApp) -> None:
    def close() -> None:
        raise SystemExit(0)

    kit.close = close  # type: ignore[method-assign]
    with pytest.raises(_Exit) as exc:
        il.finish_simulation_app(0)
    assert exc.value.code == 0 and _pending_watchdogs() == []


def test_cli_error_after_app_start_prints_traceback_and_exits_1(
    kit: StandInApp, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def crash(argv: object) -> int:
        raise RuntimeError("Simulation context already exists")

    monkeypatch.setattr(cli, "_main", crash)
    with pytest.raises(_Exit) as exc:
        cli.main(["train"])
    assert exc.value.code == 1 and kit.closed == 0
    assert "Simulation context already exists" in capsys.readouterr().err


def test_cli_without_app_is_unchanged() -> None:
    assert il._APP is None
    with pytest.raises(SystemExit):
        cli.main(["--help"])


def test_evaluation_uses_a_slice_of_the_one_env(tmp_path: Path) -> None:
    made: list[StandInEnv] = []

    def factory(cfg: EnvConfig) -> il.IsaacLabVecEnv:
        stand_in = StandInEnv(None)
        made.append(stand_in)
        return il.IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, StandInApp()))

    overrides = [*NO_EXPORT, "total_steps=80", "eval.num_envs=2", "eval.interval=40"]
    trainer = Trainer(compose_config(overrides), tmp_path, env_factory=factory)
    env = trainer.env
    row = trainer.train()
    assert len(made) == 1 and trainer.eval_env is None  # never a second simulator
    assert trainer.collector.episode_tracker.returns.shape == (N - 2,)  # the other envs
    assert "eval_return" in row and "episode_return" in row
    # The eval rows act deterministically: the same obs gives the same action every time.
    obs = torch.zeros(N, env.obs_dim)
    eval_slice = trainer.collector.eval_slice
    a1 = eval_slice.actions(trainer.learner.act, obs, torch.ones(N, env.action_dim))
    a2 = eval_slice.actions(trainer.learner.act, obs, torch.ones(N, env.action_dim))
    assert torch.equal(a1[:2], a2[:2]) and torch.equal(a1[2:], torch.ones(N - 2, 2))
    trainer.close()


def test_eval_slice_must_leave_training_envs(tmp_path: Path) -> None:
    def factory(cfg: EnvConfig) -> il.IsaacLabVecEnv:
        return il.IsaacLabVecEnv(cfg, make_gym_env=lambda c: (StandInEnv(None), StandInApp()))

    with pytest.raises(ConfigError, match=r"eval.num_envs=4 must be in \[1, env.num_envs=4\)"):
        Trainer(compose_config([*NO_EXPORT, "eval.num_envs=4"]), tmp_path, env_factory=factory)


def test_fastlora_config_build_refuses_isaaclab_3(monkeypatch: pytest.MonkeyPatch) -> None:
    import fast_lora_td3.envs.isaaclab_names as names
    import fast_lora_td3.tasks.isaaclab_g1 as g1

    monkeypatch.setattr(names, "isaaclab_version", lambda: (3, 0))
    with pytest.raises(ConfigError, match="Warp arrays"):
        g1.G1RoughOffPolicyEnvCfg  # noqa: B018  (the lazy build runs the check first)


def test_ppo_baseline_builds_one_env_on_isaaclab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fast_lora_td3.training.ppo as ppo

    made: list[StandInEnv] = []

    def factory(cfg: EnvConfig) -> il.IsaacLabVecEnv:
        made.append(StandInEnv(None))
        return il.IsaacLabVecEnv(cfg, make_gym_env=lambda c: (made[-1], StandInApp()))

    monkeypatch.setattr(ppo, "make_env", factory)
    overrides = ["algo=ppo", "env.backend=dummy", "device=cpu", "ppo.num_steps_per_env=4"]
    overrides += ["total_steps=32", "eval.num_envs=2", "progress=false", f"run_dir={tmp_path}"]
    cfg = compose_config(overrides)
    assert ppo.run_ppo(cfg) == 0 and len(made) == 1


def test_launch_app_once_per_process_with_the_rank_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    class FakeLauncher:
        def __init__(self, **kwargs: object) -> None:
            calls.append(kwargs)
            self.app = StandInApp()

    monkeypatch.setitem(
        sys.modules, "isaaclab.app", types.SimpleNamespace(AppLauncher=FakeLauncher)
    )
    monkeypatch.setattr(il, "_APP", None)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    for name in ("WORLD_SIZE", "LOCAL_RANK"):  # set first so that undo removes them again
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    cfg = EnvConfig(backend="isaaclab", device="cuda:1")
    app = il.launch_app(cfg)
    assert il.launch_app(cfg) is app and len(calls) == 1  # never a second Kit app
    assert calls[0]["distributed"] is True and os.environ["LOCAL_RANK"] == "1"
