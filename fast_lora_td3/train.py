"""`fast-lora-td3 train`: resolve the run directory, build the Trainer, handle resume and preemption."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

from fast_lora_td3.config.cpu_defaults import SIZED_KEYS, apply_cpu_defaults
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import resolve_device, resolve_runtime, validate
from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.runs.checkpoint import CheckpointManager, corruption, warn_skipped
from fast_lora_td3.runs.checkpoint_state import check_compatible
from fast_lora_td3.runs.run_logger import (
    CONFIG_FILE,
    ensure_dir,
    make_run_dir,
    remove_failed_run_dir,
)

EXIT_DISTRIBUTED_FAILURE = 3
"""Exit code of a rank whose collective failed (a peer died or timed out)."""


def resumes(cfg: TrainConfig) -> bool:
    """Whether this start continues a run: `resume=true`, or a `run_dir` that has checkpoints/."""
    return cfg.resume or (cfg.run_dir is not None and Path(cfg.run_dir, "checkpoints").exists())


def find_resume_dir(cfg: TrainConfig) -> Path:
    """The run directory to continue: `run_dir`, the run of `checkpoint`, or the newest run of
    this task (and run_name) under log_dir that has a checkpoint."""
    if cfg.run_dir:
        if not Path(cfg.run_dir).is_dir():
            what = "is not a directory" if Path(cfg.run_dir).exists() else "does not exist"
            raise ConfigError(
                f"resume=true but run_dir={cfg.run_dir} {what} (give an existing run directory, "
                "or resume=false to start a new run there)"
            )
        return Path(cfg.run_dir)
    if cfg.checkpoint:
        ckpt = Path(cfg.checkpoint)
        if not ckpt.exists():
            raise CheckpointError(f"resume=true but checkpoint={ckpt} does not exist")
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


def resume_checkpoint(cfg: TrainConfig, run_dir: Path, *, warn: bool = True) -> Path | None:
    """The checkpoint file a resume starts from: `checkpoint=<file>` exactly, else the newest intact
    checkpoint of `run_dir` (one warning line per corrupt one skipped, when `warn`). None: start
    from step 0, only when nothing asked for a resume (a `run_dir` whose run never reached a
    checkpoint).

    Raises CheckpointError when resume=true finds no checkpoint, or when every checkpoint is
    corrupt: starting over would write a second history into the run's metrics.jsonl."""
    if cfg.checkpoint and Path(cfg.checkpoint).is_file():
        path = Path(cfg.checkpoint)
        reason = corruption(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint={path} is corrupt ({reason}); nothing was changed")
        return path
    ckpt_dir = run_dir / "checkpoints"
    manager = CheckpointManager(ckpt_dir, keep_last=max(1, cfg.keep_checkpoints))
    path, skipped = manager.scan()
    if path is None and skipped:  # one line: the error, not a warning per file before it
        newest, reason = skipped[0]
        raise CheckpointError(
            f"resume: all {len(skipped)} checkpoints in {ckpt_dir} are corrupt (newest: "
            f"{newest.name}, {reason}); nothing was changed: restore a checkpoint, or start a new "
            "run (run_dir=null resume=false)"
        )
    for p, reason in skipped if warn else ():
        warn_skipped(p, reason)
    if path is not None:
        return path
    if any(ckpt_dir.glob("ppo_*.pt")):
        raise CheckpointError(
            f"{run_dir} is an algo=ppo run (ppo_*.pt): it cannot be resumed with "
            f"algo={cfg.algo.name}; start a new run (a new run_dir, resume=false)"
        )
    if cfg.resume:
        raise CheckpointError(
            f"resume=true but {ckpt_dir} has no checkpoint (ckpt_<step>.pt); start a new run "
            "with resume=false"
        )
    return None


INVOCATION_KEYS = ("run_dir", "checkpoint", "resume", "dry_run")
"""Keys describing this start itself: `reuse_saved_config` never takes them from the saved run."""


def check_resumable(ckpt: Path, cfg: TrainConfig) -> None:
    """`check_compatible` of the checkpoint's config with `cfg`, reading only the config (the
    tensors are memory-mapped, not read), so a refusal comes before the env is built."""
    from omegaconf import OmegaConf

    state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    current = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    check_compatible(state["config"], current, source=ckpt)  # type: ignore[arg-type]


def saved_run_config(run_dir: Path) -> Path | None:
    """The config file of the run's latest start: `config_resume_<k>.yaml` with the highest k (a
    resume with changed settings), else `config.yaml`; None when the run has none."""
    resumed = sorted(
        (int(p.stem.rsplit("_", 1)[1]), p)
        for p in run_dir.glob("config_resume_*.yaml")
        if p.stem.rsplit("_", 1)[1].isdigit()
    )
    if resumed:
        return resumed[-1][1]
    path = run_dir / CONFIG_FILE
    return path if path.is_file() else None


def reuse_saved_config(cfg: TrainConfig, explicit: set[str]) -> TrainConfig:
    """On a resume of `run_dir` (or of `checkpoint=`), the run's saved config with the keys the
    command line set (`explicit`) taken from `cfg`; `cfg` unchanged when there is no saved run.

    A group choice (`critic=…`) takes the whole group from the command line except its CPU-sized
    keys (sized when the run started, and saved so)."""
    from omegaconf import OmegaConf

    if not resumes(cfg) or not (cfg.run_dir or cfg.checkpoint):
        return cfg
    run_dir = Path(cfg.run_dir) if cfg.run_dir else find_resume_dir(cfg)
    path = saved_run_config(run_dir)
    if path is None:
        return cfg
    saved = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    given = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(saved, dict) and isinstance(given, dict)
    # What this start was asked to do, never the saved run's (it may have been moved or copied).
    for key in INVOCATION_KEYS:
        saved[key] = given[key]
    for key in sorted(explicit):
        *parents, leaf = key.split(".")
        src, dst = given, saved
        for part in parents:  # keys outside the schema were refused when `cfg` was composed
            if not isinstance(src.get(part), dict) or not isinstance(dst.get(part), dict):
                break
            src, dst = src[part], dst[part]
        else:
            if leaf not in src:
                continue
            value = src[leaf]
            if isinstance(value, dict) and isinstance(dst.get(leaf), dict):
                keep = {s.split(".")[-1] for s in SIZED_KEYS if s.startswith(f"{key}.")}
                keep -= {k.split(".")[-1] for k in explicit if k.startswith(f"{key}.")}
                value = {k: v for k, v in value.items() if k not in keep or k not in dst[leaf]}
                value = {**dst[leaf], **value}
            dst[leaf] = value
    try:
        node = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
        return OmegaConf.to_object(node)  # type: ignore[return-value]
    except Exception as exc:  # a run saved by a version with other keys
        msg = " ".join(str(exc).split("\n")[0].split())
        raise ConfigError(
            f"run_dir={run_dir}: its saved {path.name} does not fit ({msg})"
        ) from None


def refuse_ppo_resume(cfg: TrainConfig) -> None:
    """The PPO baseline cannot continue a run: refuse in one line instead of restarting at step 0
    under a metrics.jsonl that reads as if it continued."""
    ppo_files = list(Path(cfg.run_dir, "checkpoints").glob("ppo_*.pt")) if cfg.run_dir else []
    if resumes(cfg):
        kind = "holds algo=ppo checkpoints" if ppo_files else "is an existing run"
        where = f"run_dir={cfg.run_dir} {kind}; " if cfg.run_dir else ""
        raise ConfigError(
            f"{where}algo=ppo runs cannot be resumed (resume is FastTD3/FastSAC only): start a new "
            "run (a new run_dir, resume=false)"
        )


def dry_run(cfg: TrainConfig) -> int:
    """Validate `cfg` and print a summary; builds nothing and writes nothing (`dry_run=true`)."""
    from fast_lora_td3.envs.factory import check_task
    from fast_lora_td3.envs.launch import world_size_from_environment

    world = world_size_from_environment()
    validate(cfg)
    check_task(cfg.env)  # an unknown task id is a mistake a dry run must catch too
    if cfg.device not in ("auto", "cpu") and not cfg.device.startswith("cuda"):
        raise ConfigError(f"device={cfg.device!r} is not valid: use cpu, cuda, cuda:N or auto")
    line = (
        f"dry run: config valid (algo={cfg.algo.name} critic={cfg.critic.family} "
        f"env={cfg.env.backend}:{cfg.env.task} num_envs={cfg.env.num_envs} world_size={world} "
        f"run_dir={cfg.run_dir or '<new>'}); nothing built\n"
    )
    # One write: under PYTHONUNBUFFERED, print() writes text and newline apart, and the ranks of
    # an srun step sharing one stdout interleave them.
    sys.stdout.write(line)
    sys.stdout.flush()
    return 0


def run_training(cfg: TrainConfig, explicit_keys: set[str] | None = None) -> int:
    """Train per `cfg`; returns the process exit code.

    `explicit_keys`: the dotted keys the command line or the preset set (cpu_defaults.explicit_keys);
    on a CPU the others among cpu_defaults.SIZED_KEYS are sized for it, and a resumed run's saved
    config is reused with these keys on top (`reuse_saved_config`). None (programmatic callers
    that built `cfg` themselves): every value is kept as given.
    """
    from fast_lora_td3.training.distributed import DistributedContext, replica_state

    reused = False
    if explicit_keys is not None:
        saved = reuse_saved_config(cfg, explicit_keys)
        cfg, reused = saved, saved is not cfg
    if cfg.dry_run:
        return dry_run(cfg)
    dist = DistributedContext.from_environment(resolve_device(cfg.device))
    resolve_runtime(cfg, dist.device)
    # A saved config was sized when its run started: sizing it again could change it.
    if explicit_keys is not None and not reused and torch.device(cfg.device).type == "cpu":
        note = apply_cpu_defaults(cfg, explicit_keys)
        if note and dist.rank == 0:
            print(note, flush=True)
    validate(cfg)
    if cfg.algo.name == "ppo":
        from fast_lora_td3.training.ppo import run_ppo

        refuse_ppo_resume(cfg)
        return run_ppo(cfg)

    from fast_lora_td3.training.trainer import PREEMPT_EXIT_CODE, Preempted, Trainer

    resume = resumes(cfg)
    run_dir: Path | None = None
    ckpt: Path | None = None
    made: Path | None = None  # a run directory this start created (removed if the start fails)
    if resume:
        run_dir = find_resume_dir(cfg)
        # Chosen, verified and checked against this config before anything is built or written.
        ckpt = resume_checkpoint(cfg, run_dir, warn=dist.is_main)
        if ckpt is not None:
            check_resumable(ckpt, cfg)
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
        if ckpt is not None:
            trainer.load_checkpoint(ckpt)
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
