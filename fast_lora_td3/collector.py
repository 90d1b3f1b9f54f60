"""The collector: steps the training envs with exploration and writes transitions to replay.

It owns the per-env exploration noise scales and the current observation; it stores the action the
environment actually executed (clamped to [-1, 1]) and the true final observation of truncated steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.envs.base import StepResult, VecEnv
from fast_lora_td3.evaluation import SliceEvaluation
from fast_lora_td3.replay import ReplayBuffer


class Collector:
    """One environment step per `step()`: act → env.step → replay.add → normaliser update."""

    def __init__(
        self, env: VecEnv, replay: ReplayBuffer, learner: OffPolicyLearner, seed: int
    ) -> None:
        self.env, self.replay, self.learner = env, replay, learner
        algo = learner.algo
        self.std_min, self.std_max = algo.std_min, algo.std_max
        self.obs, self.critic_obs = env.reset(seed=seed)
        self.noise_std = self._draw_std(env.num_envs)
        self.eval_slice: SliceEvaluation | None = None
        """Set by the trainer on one-env-per-process simulators: rows acting deterministically."""

    def _draw_std(self, n: int) -> Tensor:
        u = torch.rand(n, 1, device=self.env.device)
        return self.std_min + (self.std_max - self.std_min) * u

    @torch.no_grad()
    def step(self) -> StepResult:
        """Advance every env one control step and store the transition."""
        obs, critic_obs = self.obs, self.critic_obs
        self.learner.update_normalizers(obs, critic_obs)
        actions = self.learner.explore(obs, self.noise_std).clamp(-1.0, 1.0)
        if self.eval_slice is not None:
            actions = self.eval_slice.actions(self.learner.act, obs, actions)
        result = self.env.step(actions)
        if self.eval_slice is not None:
            self.eval_slice.record(result.reward, result.terminated | result.truncated)
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
        done = (result.terminated | result.truncated).unsqueeze(-1)
        # A new episode draws a new exploration scale (SPEC §2.1).
        self.noise_std = torch.where(done, self._draw_std(self.env.num_envs), self.noise_std)
        self.obs, self.critic_obs = result.obs, result.critic_obs
        return result

    def state_dict(self) -> dict[str, Any]:
        """Current observation, noise scales and, where the env supports it, the env state."""
        state: dict[str, Any] = {
            "obs": self.obs,
            "critic_obs": self.critic_obs,
            "noise_std": self.noise_std,
        }
        if hasattr(self.env, "state_dict"):
            state["env"] = self.env.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; without an env state the envs keep their fresh reset (episodes restart)."""
        self.noise_std = state["noise_std"].to(self.env.device)
        if "env" in state and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.env.device)
            self.critic_obs = state["critic_obs"].to(self.env.device)
