"""The training loop: thin glue over env → collector → replay → learner → checkpoint.

Per iteration (one env step of every env): collect, then `num_updates` critic updates with an actor
update every `policy_frequency` critic updates. Metrics accumulate on device in the MetricsWindow and
are read once per metrics row; the FiniteGuard reads one flag every `nan_check_interval` iterations;
the CheckpointManager decides when to checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from fast_lora_td3.algos import make_learner
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import simulator_seed
from fast_lora_td3.envs import make_env
from fast_lora_td3.envs.base import StepResult, VecEnv
from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.replay.buffer import ReplayBuffer
from fast_lora_td3.runs.checkpoint import CheckpointManager
from fast_lora_td3.runs.checkpoint_state import check_compatible, rng_state, set_rng_state
from fast_lora_td3.runs.run_logger import RunLogger
from fast_lora_td3.training.collector import Collector
from fast_lora_td3.training.distributed import DistributedContext
from fast_lora_td3.training.evaluation import SliceEvaluation, evaluate
from fast_lora_td3.training.finite_guard import FiniteGuard
from fast_lora_td3.training.metrics_window import MetricsWindow, ValueRangeWatch
from fast_lora_td3.training.preemption import PreemptionSignal
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig
from fast_lora_td3.training.weight_change import weight_change_norms, weight_snapshot

PREEMPT_EXIT_CODE = 75
"""Exit code after a SIGTERM/SIGUSR1 checkpoint (EX_TEMPFAIL): requeue scripts resubmit on it."""

FIRST_EPISODE_POLL_S = 1.0
"""Until the first training episode is logged, check for one this often (one host read)."""

WEIGHT_STATS_EVERY_ROWS = 10
"""Adapter norms and weight change from init (SVDs, a pass over the critic) on the first, every
10th and the last metrics row."""


class CompileMismatchError(ConfigError):
    """Compiled and eager updates disagree beyond tolerance (verify_compile=true)."""


class Preempted(Exception):
    """Raised after the preemption checkpoint is written; the CLI exits with PREEMPT_EXIT_CODE."""


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """FastTD3 / FastSAC training for one resolved TrainConfig and run directory."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        env_factory: Callable[..., VecEnv] = make_env,
        rank: int = 0,
        world_size: int = 1,
        dist: DistributedContext | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.rank, self.world_size = cfg, Path(run_dir), rank, world_size
        self.dist = dist or DistributedContext(device=cfg.device)
        self.device = torch.device(cfg.device)
        env_cfg = dataclasses.replace(cfg.env, seed=simulator_seed(cfg) + rank)
        self.env_seed = env_cfg.seed
        self.env = env_factory(env_cfg)
        # After the env: simulators may reseed torch's global RNG themselves (mjlab does).
        seed_everything(cfg.seed + rank)
        self.eval_env: VecEnv | None = None
        self.env_factory = env_factory
        algo = cfg.algo
        self.num_envs = self.env.num_envs
        self.iterations = max(1, cfg.total_steps // self.num_envs)
        self.learner = make_learner(
            algo,
            cfg.critic,
            cfg.actor,
            self.env.obs_dim,
            self.env.critic_obs_dim,
            self.env.action_dim,
            self.device,
            total_iterations=self.iterations,
            amp=cfg.amp,
        )
        self.replay = ReplayBuffer(
            self.num_envs,
            algo.buffer_size,
            self.env.obs_dim,
            self.env.action_dim,
            critic_obs_dim=self.env.critic_obs_dim if self.env.has_critic_obs else 0,
            device=self.device,
            n_step=algo.n_step,
            gamma=algo.gamma,
            max_episode_length=self.env.max_episode_length,
            obs_dtype=getattr(torch, algo.replay_obs_dtype),
            action_dtype=getattr(torch, algo.replay_action_dtype),
        )
        if self.dist.enabled:
            for module in self.learner.modules().values():
                self.dist.broadcast_module_(module)
            self.learner.grad_sync = self.dist.allreduce_grads_
            # Every rank normalises with the statistics of all ranks' rollouts: replicas stay equal.
            self.learner.obs_normalizer.distributed = True
            self.learner.critic_obs_normalizer.distributed = True
            if self.learner.reward_scaler is not None:
                self.learner.reward_scaler.distributed = True
        self.update_step = UpdateStep(self.learner, UpdateStepConfig.from_train_config(cfg))
        self.collector = Collector(self.env, self.replay, self.learner, seed=self.env_seed)
        if getattr(self.env, "single_instance", False):  # Isaac Lab: no second env in-process
            self.collector.eval_slice = SliceEvaluation(self.env, cfg.eval.num_envs)
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", cfg.keep_checkpoints, interval=cfg.checkpoint_interval
        )
        self.iteration = 0
        self.eval_every = max(1, cfg.eval.interval // self.num_envs) if cfg.eval.interval > 0 else 0
        """Iterations between evaluations (0: only at the end)."""
        self.window = MetricsWindow(
            cfg.log_interval, cfg.log_interval_s, self.num_envs, poll_s=FIRST_EPISODE_POLL_S
        )
        self.value_watch = ValueRangeWatch(algo.support_bounds(), algo.auto_value_range)
        self.stopping = False
        """Whether the current iteration is the run's last (total_steps or max_wall_s reached)."""
        self.finite_guard = FiniteGuard(
            cfg.nan_check_interval,
            cfg.nan_action,
            self.num_envs,
            self.env.device,
            checkpoints=self.checkpoints if rank == 0 else None,
            state=self.state_dict,
        )
        # An `auto` choice (mode "pending" until the first batch) runs the parity check itself.
        self._verify_pending = cfg.verify_compile and self.update_step.mode not in (
            "eager",
            "pending",
        )
        self.preemption = PreemptionSignal(self.dist)
        self.logger: RunLogger | None = None
        # The critic's weights at init (the seed fixes them, so a resume rebuilds the same ones).
        self._critic_init = weight_snapshot(self.learner.critic)

    @property
    def env_steps(self) -> int:
        """Environment steps so far, summed over envs and ranks."""
        return self.iteration * self.num_envs * self.world_size

    # -- checkpoints --------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        """The resolved config as plain containers."""
        return OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True)  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit (replay only when save_replay=true)."""
        state = {
            # The update count (UpdateStep's) keeps its place in the learner state: same format.
            "learner": {**self.learner.state_dict(), **self.update_step.state_dict()},
            "collector": self.collector.state_dict(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "rng": rng_state(),
            "config": self.config_dict(),
        }
        if self.cfg.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def save_checkpoint(self) -> Path:
        """Atomic checkpoint of the full training state (rank 0 only)."""
        return self.checkpoints.save(self.state_dict(), self.iteration * self.num_envs)

    def load_checkpoint(self, path: Path | None = None) -> None:
        """Restore from `path` (default: the latest checkpoint of this run directory)."""
        path = path or self.checkpoints.latest()
        if path is None:
            raise CheckpointError(
                f"resume=true but {self.run_dir / 'checkpoints'} has no checkpoint"
            )
        state = self.checkpoints.load(path, map_location=self.device)
        check_compatible(state["config"], self.config_dict(), source=path)
        self.learner.load_state_dict(state["learner"])
        self.update_step.load_state_dict(state["learner"])
        self.iteration = int(state["iteration"])
        if self.dist.enabled:
            # The checkpoint holds rank 0's envs, replay and RNG only: every rank keeps its own env
            # stream, re-seeded per rank and step, and refills replay so all ranks update in step.
            seed_everything(self.cfg.seed + self.rank + 7919 * self.iteration)
            return
        self.collector.load_state_dict(state["collector"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        set_rng_state(state["rng"])

    def _verify_compile(self) -> None:
        """`verify_compile=true`: a few updates eager and compiled from the same state must agree;
        refuse to train otherwise (torch.compile has silently broken learning before)."""
        from fast_lora_td3.training.update_step import verify_compile

        self._verify_pending = False
        try:
            report = verify_compile(
                self.learner,
                lambda: self.replay.sample_nstep(self.cfg.algo.batch_size),
                self.update_step.flags,
            )
        except RuntimeError as exc:
            raise CompileMismatchError(f"verify_compile failed, refusing to train: {exc}") from None
        if self.rank == 0:
            print(f"verify_compile: eager and compiled updates agree ({report})", flush=True)

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGUSR1 (Slurm preemption, `--signal=B:USR1@120`) → checkpoint and exit."""
        self.preemption.install()

    # -- the loop -----------------------------------------------------------------------------
    def run_evaluation(self) -> dict[str, float]:
        """Deterministic episodes on the separate eval envs. The training RNG streams are forked, so
        the evaluation schedule never changes the training trajectory. On one-env-per-process
        simulators: the episodes of the deterministic slice of the training envs."""
        if self.collector.eval_slice is not None:
            return self.collector.eval_slice.pop()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if self.eval_env is None:
                eval_cfg = dataclasses.replace(
                    self.cfg.env, num_envs=self.cfg.eval.num_envs, seed=self.env_seed + 10_000
                )
                self.eval_env = self.env_factory(eval_cfg)
            return evaluate(self.learner.act, self.eval_env, self.cfg.eval.max_steps)

    def train(self) -> dict[str, float]:
        """Run until total_steps; returns the last metrics row."""
        if self.rank == 0:
            self.logger = RunLogger(
                self.run_dir,
                logger=self.cfg.logger,
                config=self.config_dict(),
                total_steps=self.cfg.total_steps,
                progress=self.cfg.progress,
                resume_step=self.env_steps if self.iteration > 0 else None,
            )
        self.window.start(self.iteration)
        deadline = time.perf_counter() + self.cfg.max_wall_s if self.cfg.max_wall_s > 0 else None
        while self.iteration < self.iterations:
            result = self._collect()
            self.iteration += 1
            self._update()
            self.finite_guard.observe(self.iteration, result, self.window.losses)
            is_last = self.stopping = self.iteration >= self.iterations or self._past(deadline)
            self._evaluate_and_log(is_last)
            if self.rank == 0 and self.checkpoints.due(self.iteration, last=is_last):
                self.save_checkpoint()
            self._stop_if_preempted()
            if is_last:
                break
        return self.window.last_row

    def _past(self, deadline: float | None) -> bool:
        """Whether the `max_wall_s` budget is spent. Ranks decide together, at log boundaries
        (a collective every iteration would cost more than the check is worth)."""
        if deadline is None:
            return False
        if not self.dist.enabled:
            return time.perf_counter() >= deadline
        if self.iteration % self.cfg.log_interval:
            return False
        return self.dist.any_true(time.perf_counter() >= deadline)

    def _stop_if_preempted(self) -> None:
        """After a preemption signal: checkpoint (rank 0) and raise Preempted."""
        if self.preemption.stop_due(self.iteration):
            if self.rank == 0:
                self.save_checkpoint()
            raise Preempted(
                f"signal {self.preemption.signum or 'on another rank'}: checkpointed at iteration {self.iteration}"
            )

    def _collect(self) -> StepResult:
        """One env step of every env, into replay (timed as `env`)."""
        t0 = time.perf_counter()
        result = self.collector.step()
        t1 = time.perf_counter()
        self.window.timings["env"] += t1 - t0
        return result

    def _update(self) -> None:
        """`num_updates` critic updates (actor updates on schedule), once replay holds enough."""
        algo, timings = self.cfg.algo, self.window.timings
        # The replay's host counter: a resume without a replay snapshot refills before updating.
        if self.replay.num_added > algo.learning_starts:
            if self._verify_pending:
                self._verify_compile()
            for _ in range(algo.num_updates):
                ts = time.perf_counter()
                batch = self.replay.sample_nstep(algo.batch_size)
                tu = time.perf_counter()
                timings["sample"] += tu - ts
                metrics = self.update_step(batch)
                timings["update"] += time.perf_counter() - tu
                self.window.add(metrics)
            self.learner.step_schedulers()

    def _evaluate_and_log(self, is_last: bool) -> None:
        """Evaluate when due, write a metrics row when one is due, advance the progress line."""
        row: dict[str, float] = {}
        if (self.eval_every and self.iteration % self.eval_every == 0) or is_last:
            row.update(self.run_evaluation())
        now = time.perf_counter()
        log_due = self.window.due(self.iteration, now, force=is_last or bool(row))
        episodes = None
        if not log_due and self.window.poll_due(now):
            # Until the first training episode is logged: one host read per second, so its
            # return shows as soon as it ends instead of at the first step-based row.
            episodes = self.collector.episode_tracker.pop()
            log_due = episodes is not None
        if log_due:
            row.update(self._log_row(episodes))
            row.update(self.window.close(self.iteration))
            if (warning := self.value_watch.check(row)) is not None and self.dist.is_main:
                print(warning, flush=True)
            if self.logger is not None:
                self.logger.log(row, env_steps=self.env_steps)
            self.window.last_row = row
        if self.logger is not None and self.cfg.progress:
            self.logger.update_progress(self.env_steps, updates=self.update_step.num_critic_updates)

    def _log_row(self, episodes: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Means of the device-side metric sums (one host read), episode stats, time split.

        `episodes`: training-episode stats already popped from the tracker (else popped here).
        """
        row = self.window.means()
        if episodes is None:
            episodes = self.collector.episode_tracker.pop()
        if episodes is not None:
            row["episode_return"] = float(episodes["mean_return"])
            row["episode_length"] = float(episodes["mean_length"])
            self.window.episode_logged = True
        row.update(self.window.time_fractions())
        if self.stopping or self.window.rows % WEIGHT_STATS_EVERY_ROWS == 0:  # this row is rows + 1
            with torch.no_grad():
                stats = self.learner.adapter_norms()
                stats.update(weight_change_norms(self.learner.critic, self._critic_init))
            values = torch.stack([v.float() for v in stats.values()]).tolist()
            row.update(dict(zip(stats, values, strict=True)))
        return row

    def close(self) -> None:
        """Close envs and loggers."""
        if self.logger is not None:
            self.logger.close()
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()
