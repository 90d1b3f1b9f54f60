"""`fast-lora-td3 train`: resolve the run directory, build the Trainer, handle resume and preemption."""

from __future__ import annotations

import sys
from pathlib import Path

from fast_lora_td3.config import TrainConfig
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.run_logger import make_run_dir
from fast_lora_td3.validate import resolve_device, validate


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


def run_training(cfg: TrainConfig) -> int:
    """Train per `cfg`; returns the process exit code."""
    from fast_lora_td3.distributed import DistributedContext

    cfg.device = resolve_device(cfg.device)
    dist = DistributedContext.from_environment(cfg.device)
    cfg.device = dist.device
    cfg.env.device = cfg.device
    validate(cfg, world_size=dist.world_size)
    if cfg.algo.name == "ppo":
        from fast_lora_td3.ppo import run_ppo

        return run_ppo(cfg)

    from fast_lora_td3.trainer import PREEMPT_EXIT_CODE, Preempted, Trainer

    resume = cfg.resume or (cfg.run_dir is not None and Path(cfg.run_dir, "checkpoints").exists())
    if resume:
        run_dir = find_resume_dir(cfg)
    elif cfg.run_dir:
        run_dir = Path(cfg.run_dir)
    else:
        run_dir = make_run_dir(Path(cfg.log_dir), cfg.env.task, cfg.run_name)
    run_dir = dist.broadcast_path(run_dir)
    trainer = Trainer(cfg, run_dir, rank=dist.rank, world_size=dist.world_size, dist=dist)
    try:
        if resume and trainer.checkpoints.latest() is not None:
            trainer.load_checkpoint()
            if dist.rank == 0:
                print(f"resumed {run_dir} at env step {trainer.env_steps}", flush=True)
        trainer.install_signal_handlers()
        row = trainer.train()
        if dist.rank == 0:
            if cfg.export_at_end:
                from fast_lora_td3.export import export_policy

                export_policy(
                    trainer.learner, trainer.env, run_dir / "exported", cfg, trainer.env_steps
                )
            summary = ", ".join(
                f"{k}={row[k]:.4g}" for k in ("eval_return", "episode_return") if k in row
            )
            print(f"done: {run_dir} ({summary})", flush=True)
        return 0
    except Preempted as exc:
        print(f"preempted: {exc}; exit {PREEMPT_EXIT_CODE} (requeue to resume)", file=sys.stderr)
        return PREEMPT_EXIT_CODE
    finally:
        trainer.close()
        dist.shutdown()
