"""`fast-lora-td3 train`: resolve the run directory, build the Trainer, handle resume and preemption."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

from fast_lora_td3.config.cpu_defaults import apply_cpu_defaults
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import resolve_device, resolve_runtime, validate
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.runs.run_logger import ensure_dir, make_run_dir, remove_failed_run_dir

EXIT_DISTRIBUTED_FAILURE = 3
"""Exit code of a rank whose collective failed (a peer died or timed out)."""


def find_resume_dir(cfg: TrainConfig) -> Path:
    """The run directory to continue: `run_dir`, the run of `checkpoint`, or the newest run of
    this task (and run_name) under log_dir that has a checkpoint."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    if cfg.checkpoint:
        ckpt = Path(cfg.checkpoint)
        return ckpt.parent.parent if ckpt.is_file() else ckpt
    root = Path(cfg.log_dir) / cfg.env.task
    suffix = f"_{cfg.run_name}" if cfg.run_name else ""
    runs = sorted(
        p
        for p in root.glob("*")
        if p.is_dir() and p.name.endswith(suffix) and any((p / "checkpoints").glob("ckpt_*.pt"))
    )
    if not runs:
        raise ConfigError(
            f"resume=true but no run with checkpoints under {root} (set run_dir=… or checkpoint=…)"
        )
    return runs[-1]


def dry_run(cfg: TrainConfig) -> int:
    """Validate `cfg` and print a summary; builds nothing and writes nothing (`dry_run=true`)."""
    from fast_lora_td3.envs.launch import world_size_from_environment

    world = world_size_from_environment()
    validate(cfg)
    if cfg.device not in ("auto", "cpu") and not cfg.device.startswith("cuda"):
        raise ConfigError(f"device={cfg.device!r} is not valid: use cpu, cuda, cuda:N or auto")
    print(
        f"dry run: config valid (algo={cfg.algo.name} critic={cfg.critic.family} "
        f"env={cfg.env.backend}:{cfg.env.task} num_envs={cfg.env.num_envs} world_size={world} "
        f"run_dir={cfg.run_dir or '<new>'}); nothing built",
        flush=True,
    )
    return 0


def run_training(cfg: TrainConfig, explicit_keys: set[str] | None = None) -> int:
    """Train per `cfg`; returns the process exit code.

    `explicit_keys`: the dotted keys the command line or the preset set (cpu_defaults.explicit_keys);
    on a CPU the others among cpu_defaults.SIZED_KEYS are sized for it. None (programmatic callers
    that built `cfg` themselves): every value is kept as given.
    """
    from fast_lora_td3.training.distributed import DistributedContext, replica_state

    if cfg.dry_run:
        return dry_run(cfg)
    dist = DistributedContext.from_environment(resolve_device(cfg.device))
    resolve_runtime(cfg, dist.device)
    if explicit_keys is not None and torch.device(cfg.device).type == "cpu":
        note = apply_cpu_defaults(cfg, explicit_keys)
        if note and dist.rank == 0:
            print(note, flush=True)
    validate(cfg)
    if cfg.algo.name == "ppo":
        from fast_lora_td3.training.ppo import run_ppo

        return run_ppo(cfg)

    from fast_lora_td3.training.trainer import PREEMPT_EXIT_CODE, Preempted, Trainer

    resume = cfg.resume or (cfg.run_dir is not None and Path(cfg.run_dir, "checkpoints").exists())
    run_dir: Path | None = None
    made: Path | None = None  # a run directory this start created (removed if the start fails)
    if resume:
        run_dir = find_resume_dir(cfg)
    elif cfg.run_dir:
        run_dir = Path(cfg.run_dir)
        if dist.is_main:
            made = None if run_dir.exists() else run_dir
            ensure_dir("run_dir", run_dir)  # made, or an existing directory we can write to
    elif dist.is_main:  # only rank 0 creates files; the others receive its path
        run_dir = made = make_run_dir(Path(cfg.log_dir), cfg.env.task, cfg.run_name)
    run_dir = dist.broadcast_path(run_dir)
    try:
        trainer = Trainer(cfg, run_dir, rank=dist.rank, world_size=dist.world_size, dist=dist)
    except BaseException:
        if made is not None:
            # up to the task's folder of log_dir; a run_dir given: that folder alone
            remove_failed_run_dir(made, made if cfg.run_dir else made.parent)
        raise
    try:
        if resume and trainer.checkpoints.latest() is not None:
            trainer.load_checkpoint()
            if dist.rank == 0:
                print(f"resumed {run_dir} at env step {trainer.env_steps}", flush=True)
        trainer.install_signal_handlers()
        row = trainer.train()
        replica = replica_state(trainer.learner)
        dist.dump_parameters(replica)
        if dist.enabled:
            fingerprint = dist.check_replicas_in_sync(replica)
            if dist.is_main:
                print(
                    f"replicas in sync on {dist.world_size} ranks: {fingerprint[:16]}", flush=True
                )
        if dist.rank == 0:
            if cfg.export_at_end:
                from fast_lora_td3.deploy.export import export_policy

                export_policy(
                    trainer.learner, trainer.env, run_dir / "exported", cfg, trainer.env_steps
                )
            summary = ", ".join(
                f"{k}={row[k]:.4g}" for k in ("eval_return", "episode_return") if k in row
            )
            print(f"done: {run_dir} ({summary})", flush=True)
        # Rank 0 exports while the others would already destroy the group: a gloo peer torn down
        # mid-export aborted once ("terminate called without an active exception").
        dist.barrier()
        code = 0
    except Preempted as exc:
        print(f"preempted: {exc}; exit {PREEMPT_EXIT_CODE} (requeue to resume)", file=sys.stderr)
        code = PREEMPT_EXIT_CODE
    except RuntimeError as exc:
        if not dist.enabled:
            raise
        # A dead or stalled peer surfaces as a backend RuntimeError: keep the traceback, end
        # with one line that says what happened, and exit non-zero so the launcher stops the job.
        traceback.print_exc()
        print(f"fast-lora-td3: error: {dist.failure_message(exc)}", file=sys.stderr, flush=True)
        code = EXIT_DISTRIBUTED_FAILURE
    finally:
        trainer.close()
        dist.shutdown()
    if dist.enabled:
        exit_without_finalization(code)
    return code


def exit_without_finalization(code: int) -> None:
    """End a data-parallel rank now that its files are closed and its group destroyed: gloo's
    worker threads can abort Python's interpreter teardown (SIGABRT, "terminate called without
    an active exception", seen twice in ~20 two-rank runs under CPU load; pytorch PR 179291), which
    turned a finished job into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
