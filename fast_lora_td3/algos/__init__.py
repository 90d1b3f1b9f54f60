"""Learners: FastTD3 and FastSAC update rules, built by name from the algorithm config."""

from __future__ import annotations

import torch

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.algos.config import AlgoConfig
from fast_lora_td3.algos.fastsac import FastSACLearner
from fast_lora_td3.algos.fasttd3 import FastTD3Learner
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import ActorConfig, CriticConfig

LEARNERS = {"fasttd3": FastTD3Learner, "fastsac": FastSACLearner}


def make_learner(
    algo: AlgoConfig,
    critic: CriticConfig,
    actor: ActorConfig,
    obs_dim: int,
    critic_obs_dim: int,
    action_dim: int,
    device: torch.device | str,
    total_iterations: int = 0,
    amp: str = "none",
) -> OffPolicyLearner:
    """Build the learner named by `algo.name`."""
    if algo.name not in LEARNERS:
        raise ConfigError(
            f"algo={algo.name!r} has no off-policy learner: use one of {sorted(LEARNERS)} (or ppo)"
        )
    return LEARNERS[algo.name](
        algo, critic, actor, obs_dim, critic_obs_dim, action_dim, device, total_iterations, amp
    )


__all__ = ["LEARNERS", "AlgoConfig", "FastSACLearner", "FastTD3Learner", "make_learner"]
