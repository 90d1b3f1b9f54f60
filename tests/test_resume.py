"""Resuming a run: the checkpoint it starts from, corrupt checkpoints, the saved config, an extended
cosine schedule, and the PPO baseline's refusals (issue 18)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from cli_helpers import NO_EXPORT as SMALL
from cli_helpers import cli

from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.training.trainer import Trainer


def one_line(result, needle: str) -> str:
    """The run failed with exit 2 and one stderr line holding `needle`, without a traceback."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 80-step run with checkpoints at steps 40 and 80 (copied per test)."""
    root = tmp_path_factory.mktemp("run")
    run_dir = root / "run"
    done = cli(
        "train",
        *SMALL,
        "total_steps=80",
        "checkpoint_interval=5",
        f"run_dir={run_dir}",
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    return run_dir


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


def ckpts(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def test_truncated_newest_checkpoint_falls_back_with_one_warning(run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(run, tmp_path)
    _, newest = ckpts(run_dir)
    newest.write_bytes(newest.read_bytes()[:1000])
    done = cli("train", *SMALL, "total_steps=120", f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warnings = [ln for ln in done.stderr.splitlines() if "warning" in ln and "checkpoint" in ln]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "truncated" in warnings[0]
    assert f"resumed {run_dir} at env step 40" in done.stdout


def test_all_checkpoints_corrupt_refuses_and_keeps_metrics(run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(run, tmp_path)
    for path in ckpts(run_dir):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # a flipped byte: only the SHA-256 sees it in tensor data
        path.write_bytes(bytes(data))
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    for args in (["resume=true"], []):
        result = cli("train", *SMALL, "total_steps=160", f"run_dir={run_dir}", *args, cwd=tmp_path)
        line = one_line(result, "all 2 checkpoints")
        assert "corrupt" in line and str(run_dir / "checkpoints") in line
        assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    for command in ("play", "export"):
        one_line(cli(command, f"checkpoint={run_dir}", cwd=tmp_path), "all 2 checkpoints")


def test_a_new_run_records_the_actor_penalty_in_force(run: Path) -> None:
    """config.yaml and the checkpoints hold the weight in force, not `null` (unset), so a later
    change of its default cannot change what a resumed run trains with."""
    import torch
    import yaml

    from fast_lora_td3.algos.config import DEFAULT_ACTOR_PREACT_L2

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algo"]["actor_preact_l2"] == DEFAULT_ACTOR_PREACT_L2
    state = torch.load(ckpts(run)[-1], map_location="cpu", weights_only=True, mmap=True)
    assert state["config"]["algo"]["actor_preact_l2"] == DEFAULT_ACTOR_PREACT_L2


def test_resume_from_the_given_checkpoint_file(run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(run, tmp_path)
    older, _ = ckpts(run_dir)
    done = cli(
        "train", *SMALL, "total_steps=80", "resume=true", f"checkpoint={older}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"resumed {run_dir} at env step 40" in done.stdout


def test_rerun_of_run_dir_reuses_its_saved_config(run: Path, tmp_path: Path) -> None:
    """Only run_dir= and the new length: backend, task, sizes come from the run's config.yaml."""
    run_dir = copy_run(run, tmp_path)
    done = cli(
        "train", f"run_dir={run_dir}", "total_steps=120", "export_at_end=false", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"resumed {run_dir} at env step 80" in done.stdout
    # An override on top that the checkpoint cannot take is refused, naming the key.
    bad = cli("train", f"run_dir={run_dir}", "total_steps=160", "algo.gamma=0.5", cwd=tmp_path)
    one_line(bad, "algo.gamma (checkpoint 0.99, now 0.5)")


def test_resume_of_a_missing_run_dir_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = cli("train", *SMALL, "resume=true", f"run_dir={missing}", cwd=tmp_path)
    one_line(result, f"run_dir={missing} does not exist")
    assert not missing.exists()


def test_play_on_another_task_names_shapes_and_setting(run: Path, tmp_path: Path) -> None:
    result = cli("play", f"checkpoint={run}", "env.task=PointMass-v0", cwd=tmp_path)
    line = one_line(result, "env.task=PointMass-v0")
    assert "in the checkpoint but" in line and "env.task=PointMassAsym-v0" in line


PPO = [
    "algo=ppo",
    "env.backend=dummy",
    "env.task=PointMass-v0",
    "env.num_envs=8",
    "device=cpu",
    "ppo.num_steps_per_env=8",
    "total_steps=128",
    "log_interval=1",
    "eval.num_envs=2",
    "eval.max_steps=10",
    "progress=false",
]


def test_ppo_runs_refuse_resume_play_and_export_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "ppo"
    done = cli("train", *PPO, f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    again = cli("train", *PPO, f"run_dir={run_dir}", cwd=tmp_path)
    one_line(again, "algo=ppo runs cannot be resumed")
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    ppo_file = next((run_dir / "checkpoints").glob("ppo_*.pt"))
    for command in ("play", "export"):
        for target in (run_dir, ppo_file):
            one_line(cli(command, f"checkpoint={target}", cwd=tmp_path), "algo=ppo")


def _lr_trace(trainer: Trainer) -> dict[int, float]:
    """Record the actor LR after every scheduler step, by training iteration."""
    trace: dict[int, float] = {}
    step = trainer.learner.step_schedulers

    def recording() -> None:
        step()
        trace[trainer.iteration] = trainer.learner.actor_optimizer.param_groups[0]["lr"]

    trainer.learner.step_schedulers = recording
    return trace


def test_extending_total_steps_follows_the_cosine_schedule(tmp_path: Path) -> None:
    """A run of N iterations resumed with total 2N has, at every iteration after the resume, the
    LR of a straight 2N run (the cosine is re-planned over the new total), not a wrapped cosine."""
    args = [*SMALL, "save_replay=true", "algo.lr_min=1e-5"]
    straight = Trainer(compose_config([*args, "total_steps=320"]), tmp_path / "a")
    straight_lr = _lr_trace(straight)
    straight.train()
    straight.close()
    first = Trainer(compose_config([*args, "total_steps=160"]), tmp_path / "b")
    first.train()
    first.close()
    resumed = Trainer(compose_config([*args, "total_steps=320"]), tmp_path / "b")
    resumed.load_checkpoint()
    resumed_lr = _lr_trace(resumed)
    resumed.train()
    resumed.close()
    assert sorted(resumed_lr) == list(range(21, 41))
    for it, lr in resumed_lr.items():
        assert math.isclose(lr, straight_lr[it], rel_tol=1e-6), (it, lr, straight_lr[it])
    assert straight_lr[40] < 2e-5  # near lr_min at the end, where a wrapped cosine climbs back
    # play builds a learner without a schedule: the checkpoint's schedulers are not in its way.
    played = cli("play", f"checkpoint={tmp_path / 'b'}", cwd=tmp_path)
    assert played.returncode == 0, played.stderr


def test_saved_config_with_command_line_keys_on_top(tmp_path: Path) -> None:
    """Leaves given on the command line win; a group choice keeps the saved run's CPU-sized keys;
    run_dir / resume always describe this start (a run directory may have been moved)."""
    import yaml
    from omegaconf import OmegaConf

    from fast_lora_td3.config.cpu_defaults import explicit_keys
    from fast_lora_td3.train import reuse_saved_config

    saved = OmegaConf.to_container(OmegaConf.structured(compose_config(SMALL)), resolve=True)
    saved["critic"]["width"], saved["critic"]["rank"] = 48, 4  # width: sized on a CPU
    saved["run_dir"], saved["algo"]["gamma"] = "/moved/away", 0.97
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    overrides = [f"run_dir={tmp_path}", "critic=simbav2_lora", "total_steps=999", "seed=5"]
    cfg = reuse_saved_config(compose_config(overrides), explicit_keys(overrides))
    assert (cfg.env.backend, cfg.env.task, cfg.algo.gamma) == ("dummy", "PointMassAsym-v0", 0.97)
    assert (cfg.total_steps, cfg.seed, cfg.run_dir) == (999, 5, str(tmp_path))
    assert cfg.critic.family == "simbav2_lora" and cfg.critic.width == 48
    assert cfg.critic.rank != 4  # the group choice resets its other keys to the group's defaults
