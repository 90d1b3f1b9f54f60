"""Shared by the backend tests: the smallest backend a script could register from outside the
package (`register_backend(name, BackendSpec("backend_helpers", "ConstantEnv", ...))`)."""

from __future__ import annotations

from typing import Any

import torch

from fast_lora_td3.envs import BackendSpec, EnvConfig, StepResult

CONSTANT_SPEC = BackendSpec(__name__, "ConstantEnv", "torch", "pip install torch")
"""Where the tiny backend lives: this module, importable because pytest puts tests/ on sys.path."""

CONSTANT_TASK = "Constant-v0"


class ConstantEnv:
    """The smallest backend: one observation, reward 1, episodes of 3 steps."""

    max_episode_length = 3

    def __init__(self, cfg: EnvConfig) -> None:
        self.num_envs, self.device = cfg.num_envs, torch.device(cfg.device)
        self.obs_dim = self.critic_obs_dim = self.action_dim = 1
        self.has_critic_obs = False
        self.steps = torch.zeros(self.num_envs, dtype=torch.long)

    @staticmethod
    def task_ids() -> tuple[str, ...]:
        return (CONSTANT_TASK,)

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.steps.zero_()
        obs = torch.zeros(self.num_envs, 1)
        return obs, obs

    def step(self, actions: torch.Tensor) -> StepResult:
        self.steps += 1
        truncated = self.steps >= self.max_episode_length
        self.steps[truncated] = 0
        obs = torch.zeros(self.num_envs, 1)
        return StepResult(
            obs=obs,
            critic_obs=obs,
            reward=torch.ones(self.num_envs),
            terminated=torch.zeros(self.num_envs, dtype=torch.bool),
            truncated=truncated,
            final_obs=obs,
            final_critic_obs=obs,
        )

    def close(self) -> None:
        pass

    def deployment_info(self) -> dict[str, Any]:
        return {}
