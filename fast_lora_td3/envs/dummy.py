"""A tiny point-mass VecEnv for tests and benchmarks (rsl_rl style dummy env); no simulator needed.

State x ∈ R^d moves by x ← x + 0.1·A·a; reward 1 − ‖x‖²/d (staying near the origin is good); an
episode terminates when ‖x‖∞ > 3 and times out after `max_episode_length` steps. Its full state
(including its RNG) is checkpointable, so resume can be bit-identical.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.envs.base import StepResult, select_done
from fast_lora_td3.envs.config import EnvConfig

DUMMY_TASKS = ("PointMass-v0", "PointMassAsym-v0")
"""Task ids of the dummy backend; the Asym variant has a privileged critic observation."""


class PointMassEnv:
    """Deterministic-per-seed vectorised point mass implementing the VecEnv protocol."""

    def __init__(self, cfg: EnvConfig, obs_dim: int = 4, action_dim: int = 2) -> None:
        """``cfg.num_envs`` point masses on ``cfg.device`` seeded with ``cfg.seed``;
        ``cfg.episode_length_s`` sets the time limit at the 50 Hz control rate (default 50 steps)."""
        num_envs = cfg.num_envs
        self.num_envs, self.obs_dim, self.action_dim = num_envs, obs_dim, action_dim
        self.has_critic_obs = cfg.task == "PointMassAsym-v0"
        self.critic_obs_dim = obs_dim + 1 if self.has_critic_obs else obs_dim
        self.max_episode_length = round(cfg.episode_length_s / 0.02) if cfg.episode_length_s else 50
        self.device = torch.device(cfg.device)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        mix = torch.randn(action_dim, obs_dim, generator=self.generator, device=self.device)
        self.mix = mix / mix.norm(dim=0, keepdim=True)
        self.state = torch.zeros(num_envs, obs_dim, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)

    @staticmethod
    def task_ids() -> tuple[str, ...]:
        """The dummy backend's task ids."""
        return DUMMY_TASKS

    def _draw(self, n: int) -> Tensor:
        return torch.rand(n, self.obs_dim, generator=self.generator, device=self.device) * 2 - 1

    def _critic(self, obs: Tensor) -> Tensor:
        if not self.has_critic_obs:
            return obs
        return torch.cat([obs, self.steps.unsqueeze(-1).float() / self.max_episode_length], -1)

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env (reseeding when `seed` is given)."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state = self._draw(self.num_envs)
        self.steps.zero_()
        return self.state.clone(), self._critic(self.state)

    def step(self, actions: Tensor) -> StepResult:
        """Move, reward, end episodes, auto-reset; final_obs is the pre-reset state."""
        self.state = self.state + 0.1 * actions.clamp(-1, 1) @ self.mix
        self.steps += 1
        reward = 1.0 - self.state.pow(2).mean(-1)
        terminated = self.state.abs().amax(-1) > 3.0
        truncated = (self.steps >= self.max_episode_length) & ~terminated
        done = terminated | truncated
        final_obs, final_critic = self.state.clone(), self._critic(self.state)
        self.state = select_done(done, self._draw(self.num_envs), self.state)
        self.steps = torch.where(done, torch.zeros_like(self.steps), self.steps)
        return StepResult(
            obs=self.state.clone(),
            critic_obs=self._critic(self.state),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            final_critic_obs=final_critic,
            info={},
        )

    def close(self) -> None:
        """Nothing to release."""

    def deployment_info(self) -> dict[str, Any]:
        """Facts for export (a point mass has no joints)."""
        return {"control_dt": 0.02, "action_scale": 0.1, "joint_names": []}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically."""
        return {
            "state": self.state.clone(),
            "steps": self.steps.clone(),
            "rng": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of state_dict."""
        self.state = state["state"].to(self.device)
        self.steps = state["steps"].to(self.device)
        self.generator.set_state(
            state["rng"].cpu() if hasattr(state["rng"], "cpu") else state["rng"]
        )
