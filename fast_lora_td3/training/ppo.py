"""`algo=ppo`: the rsl_rl PPO baseline on the same VecEnv, writing the same run directory.

rsl_rl's OnPolicyRunner drives the rollouts and updates; we call `learn()` in chunks of
`log_interval` iterations and, between chunks, write `metrics.jsonl` rows (training episode return,
value loss as `critic_loss`, deterministic `eval_return` on separate eval envs) and checkpoints, so
`fast-lora-td3 plot` shows PPO and FastTD3 runs side by side.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch import Tensor

from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.envs import make_env
from fast_lora_td3.envs.base import EpisodeTracker, VecEnv
from fast_lora_td3.runs.run_logger import RunLogger, make_run_dir
from fast_lora_td3.training.evaluation import evaluate


class RslRlEnvAdapter:
    """rsl_rl's VecEnv interface over our VecEnv (observation groups `actor` / `critic`)."""

    def __init__(self, env: VecEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = env.action_dim
        self.max_episode_length = env.max_episode_length
        self.device = env.device
        self.cfg: dict[str, Any] = {}
        self.episode_length_buf = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.episode_tracker = EpisodeTracker(env.num_envs, env.device)
        """Training-episode return/length (the env is a pure adapter and keeps none)."""
        self._obs = TensorDict({}, batch_size=[env.num_envs], device=env.device)
        obs, critic_obs = env.reset()
        self._set_obs(obs, critic_obs)

    def _set_obs(self, obs: Tensor, critic_obs: Tensor) -> None:
        self._obs = TensorDict(
            {"actor": obs, "critic": critic_obs}, batch_size=[self.num_envs], device=self.device
        )

    def get_observations(self) -> TensorDict:
        """Current observations of both groups."""
        return self._obs

    def step(self, actions: Tensor) -> tuple[TensorDict, Tensor, Tensor, dict]:
        """Step; time-outs go to `extras["time_outs"]` so PPO bootstraps them (rsl_rl convention)."""
        result = self.env.step(actions.clamp(-1.0, 1.0))
        self._set_obs(result.obs, result.critic_obs)
        dones = result.terminated | result.truncated
        self.episode_tracker.update(result.reward, dones)
        self.episode_length_buf = torch.where(
            dones, torch.zeros_like(self.episode_length_buf), self.episode_length_buf + 1
        )
        extras = {"time_outs": result.truncated, "log": result.info.get("log", {})}
        return self._obs, result.reward, dones.long(), extras


def rsl_rl_train_cfg(cfg: TrainConfig) -> dict[str, Any]:
    """rsl_rl's runner dict (mjlab's defaults for OnPolicyRunner) with our `ppo.*` settings."""
    from mjlab.rl.config import RslRlModelCfg, RslRlOnPolicyRunnerCfg, RslRlPpoAlgorithmCfg

    p = cfg.ppo
    runner = RslRlOnPolicyRunnerCfg(
        seed=cfg.seed,
        num_steps_per_env=p.num_steps_per_env,
        actor=RslRlModelCfg(
            hidden_dims=tuple(p.actor_hidden_dims),
            obs_normalization=True,
            distribution_cfg={
                "class_name": "GaussianDistribution",
                "init_std": p.init_noise_std,
                "std_type": "scalar",
            },
        ),
        critic=RslRlModelCfg(hidden_dims=tuple(p.critic_hidden_dims), obs_normalization=True),
        algorithm=RslRlPpoAlgorithmCfg(
            learning_rate=p.learning_rate,
            num_learning_epochs=p.num_learning_epochs,
            num_mini_batches=p.num_mini_batches,
            entropy_coef=p.entropy_coef,
            gamma=cfg.algo.gamma,
        ),
        logger="tensorboard",
    )
    train_cfg = dataclasses.asdict(runner)
    # rsl_rl's MLPModel takes no None-valued optional configs (mjlab's runner strips them too).
    for key in ("actor", "critic"):
        for opt in ("cnn_cfg", "distribution_cfg"):
            if train_cfg[key].get(opt) is None:
                train_cfg[key].pop(opt, None)
        if train_cfg[key].get("rnn_type") is None:
            for opt in ("rnn_type", "rnn_hidden_dim", "rnn_num_layers"):
                train_cfg[key].pop(opt, None)
    return train_cfg


def run_ppo(cfg: TrainConfig) -> int:
    """Train the PPO baseline; returns the exit code."""
    from rsl_rl.runners import OnPolicyRunner

    torch.manual_seed(cfg.seed)
    run_dir = (
        Path(cfg.run_dir)
        if cfg.run_dir
        else make_run_dir(Path(cfg.log_dir), cfg.env.task, cfg.run_name)
    )
    env = make_env(cfg.env)
    adapter = RslRlEnvAdapter(env)
    runner = OnPolicyRunner(adapter, rsl_rl_train_cfg(cfg), log_dir=None, device=cfg.device)
    last_losses: dict[str, float] = {}
    update = runner.alg.update

    def update_and_keep() -> dict[str, float]:
        losses = update()
        last_losses.update(losses)
        return losses

    runner.alg.update = update_and_keep  # keep the losses that learn() does not hand back
    steps_per_it = env.num_envs * cfg.ppo.num_steps_per_env
    iterations = max(1, cfg.total_steps // steps_per_it)
    chunk = max(1, min(cfg.log_interval, iterations))
    config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    logger = RunLogger(
        run_dir,
        logger=cfg.logger,
        config=config,
        total_steps=cfg.total_steps,
        progress=cfg.progress,
    )
    eval_env = None
    eval_every = max(1, cfg.eval.interval // steps_per_it) if cfg.eval.interval > 0 else 0
    # One simulator per process (Isaac Lab): no separate eval env; stochastic training returns only.
    single_instance = bool(getattr(env, "single_instance", False))
    if single_instance:
        print("ppo: no evaluation on this simulator (one env per process)", flush=True)
    done_its = 0
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    window_start, window_its = time.perf_counter(), 0
    deadline = window_start + cfg.max_wall_s if cfg.max_wall_s > 0 else float("inf")
    try:
        while done_its < iterations:
            # One PPO iteration per learn() call, so rows can also be written on a time basis
            # (log_interval_s): a CPU iteration of a locomotion task takes seconds.
            runner.learn(num_learning_iterations=1, init_at_random_ep_len=done_its == 0)
            done_its += 1
            window_its += 1
            elapsed = time.perf_counter() - window_start
            out_of_time = time.perf_counter() >= deadline  # max_wall_s: last iteration
            at_interval = done_its % chunk == 0 or done_its >= iterations or out_of_time
            if not at_interval and not 0 < cfg.log_interval_s <= elapsed:
                continue
            n, window_start, window_its = window_its, time.perf_counter(), 0
            row: dict[str, float] = {"env_steps_per_s": n * steps_per_it / max(elapsed, 1e-9)}
            episodes = adapter.episode_tracker.pop()
            if episodes is not None:
                row["episode_return"] = float(episodes["mean_return"])
                row["episode_length"] = float(episodes["mean_length"])
            if last_losses:
                row["critic_loss"] = float(last_losses["value"])
                row["surrogate_loss"] = float(last_losses["surrogate"])
            is_last = done_its >= iterations or out_of_time
            if ((eval_every and done_its % eval_every < n) or is_last) and not single_instance:
                if eval_env is None:
                    eval_cfg = dataclasses.replace(
                        cfg.env, num_envs=cfg.eval.num_envs, seed=(cfg.env.seed or 0) + 10_000
                    )
                    eval_env = make_env(eval_cfg)
                policy = runner.get_inference_policy(device=cfg.device)

                def act(obs: Tensor, policy: Any = policy) -> Tensor:
                    td = TensorDict({"actor": obs, "critic": obs}, batch_size=[obs.shape[0]])
                    return policy(td)

                row.update(evaluate(act, eval_env, cfg.eval.max_steps))
                runner.alg.train_mode()
            logger.log(row, env_steps=done_its * steps_per_it)
            if at_interval:
                runner.save(str(run_dir / "checkpoints" / f"ppo_{done_its * steps_per_it:012d}.pt"))
            if is_last:
                break
        print(
            f"done: {run_dir} (eval_return={row.get('eval_return', float('nan')):.4g})", flush=True
        )
    finally:
        logger.close()
        env.close()
        if eval_env is not None:
            eval_env.close()
    return 0
