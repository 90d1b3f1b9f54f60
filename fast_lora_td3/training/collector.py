"""The collector: steps the training envs with exploration and writes transitions to replay.

It owns the per-env exploration noise scales, the current observation and the training-episode
statistics (``episode_tracker``: the backends are pure adapters); it stores the action the
environment actually executed (clamped to [-1, 1]) and the true final observation of truncated steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.envs.base import EpisodeTracker, StepResult, VecEnv
from fast_lora_td3.replay.buffer import ReplayBuffer
from fast_lora_td3.training.evaluation import SliceEvaluation


class Collector:
    """One environment step per `step()`: act → env.step → episode stats → replay.add → normaliser
    update."""

    def __init__(
        self, env: VecEnv, replay: ReplayBuffer, learner: OffPolicyLearner, seed: int
    ) -> None:
        self.env, self.replay, self.learner = env, replay, learner
        algo = learner.algo
        self.std_min, self.std_max = algo.std_min, algo.std_max
        self.obs, self.critic_obs = env.reset(seed=seed)
        self.noise_std = self._draw_std(env.num_envs)
        self.discounted_return = torch.zeros(env.num_envs, device=env.device)
        """Each env's running discounted return G (the automatic value range's statistic)."""
        self.episode_tracker = EpisodeTracker(env.num_envs, env.device)
        """Return/length of the training episodes (``pop()`` at logging intervals: one host read)."""
        self._eval_slice: SliceEvaluation | None = None

    @property
    def eval_slice(self) -> SliceEvaluation | None:
        """Set by the trainer on one-env-per-process simulators: rows acting deterministically."""
        return self._eval_slice

    @eval_slice.setter
    def eval_slice(self, eval_slice: SliceEvaluation | None) -> None:
        # The eval rows [0, rows) count their own episodes: the training statistics cover the rest.
        self._eval_slice = eval_slice
        rows = eval_slice.rows if eval_slice is not None else 0
        self.episode_tracker = EpisodeTracker(self.env.num_envs - rows, self.env.device)

    def _draw_std(self, n: int) -> Tensor:
        u = torch.rand(n, 1, device=self.env.device)
        return self.std_min + (self.std_max - self.std_min) * u

    @torch.no_grad()
    def step(self) -> StepResult:
        """Advance every env one control step, count episode statistics and store the transition."""
        obs, critic_obs = self.obs, self.critic_obs
        self.learner.update_normalizers(obs, critic_obs)
        actions = self.learner.explore(obs, self.noise_std).clamp(-1.0, 1.0)
        if self.eval_slice is not None:
            actions = self.eval_slice.actions(self.learner.act, obs, actions)
        result = self.env.step(actions)
        done = result.terminated | result.truncated
        self.discounted_return = self.discounted_return * self.learner.algo.gamma + result.reward
        self.learner.update_reward_scale(self.discounted_return)
        self.discounted_return = torch.where(done, 0.0, self.discounted_return)
        if self.eval_slice is None:
            self.episode_tracker.update(result.reward, done)
        else:
            self.eval_slice.record(result.reward, done)
            train_rows = slice(self.eval_slice.rows, None)
            self.episode_tracker.update(result.reward[train_rows], done[train_rows])
        self.replay.add(
            obs,
            actions,
            result.reward,
            result.terminated,
            result.truncated,
            final_obs=result.final_obs,
            critic_obs=critic_obs if self.replay.critic_obs_dim else None,
            final_critic_obs=result.final_critic_obs if self.replay.critic_obs_dim else None,
        )
        # A new episode draws a new exploration scale (per-episode noise scales diversify data).
        self.noise_std = torch.where(
            done.unsqueeze(-1), self._draw_std(self.env.num_envs), self.noise_std
        )
        self.obs, self.critic_obs = result.obs, result.critic_obs
        return result

    def state_dict(self) -> dict[str, Any]:
        """Current observation, noise scales and, where the env supports it, the env state and the
        running episodes."""
        state: dict[str, Any] = {
            "obs": self.obs,
            "critic_obs": self.critic_obs,
            "noise_std": self.noise_std,
            "discounted_return": self.discounted_return,
        }
        if hasattr(self.env, "state_dict"):
            state["env"] = self.env.state_dict()
            tracker = self.episode_tracker
            state["episodes"] = (tracker.returns.clone(), tracker.lengths.clone())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; without an env state the envs keep their fresh reset (episodes restart)."""
        self.noise_std = state["noise_std"].to(self.env.device)
        if "discounted_return" in state:  # checkpoints before the automatic value range had none
            self.discounted_return = state["discounted_return"].to(self.env.device)
        if "env" in state and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.env.device)
            self.critic_obs = state["critic_obs"].to(self.env.device)
            # Checkpoints written before the collector kept the statistics hold them in the env's.
            returns, lengths = state.get("episodes") or state["env"]["tracker"]
            self.episode_tracker.returns = returns.to(self.env.device)
            self.episode_tracker.lengths = lengths.to(self.env.device)
