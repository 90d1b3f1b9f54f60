"""Shared by the learner tests: small critic / actor configs, a CPU learner, and a bandit batch
with a known optimal Q."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fast_lora_td3.algos import AlgoConfig, FastTD3Learner, make_learner
from fast_lora_td3.nn import ActorConfig, CriticConfig

OBS, ACT = 6, 2


def small_critic(family: str) -> CriticConfig:
    layers = ["hidden"] if family == "mlp_lora" else ["blocks"]
    return CriticConfig(
        family=family, hidden_dims=[64, 64], width=32, num_blocks=1, rank=4, lora_layers=layers
    )


def small_actor() -> ActorConfig:
    return ActorConfig(hidden_dims=[32, 32])


def make(algo_name: str = "fasttd3", family: str = "mlp", **algo_kw) -> FastTD3Learner:
    base = dict(name=algo_name, num_atoms=51, v_min=-5.0, v_max=5.0, batch_size=64)
    base.update(algo_kw)
    return make_learner(
        AlgoConfig(**base), small_critic(family), small_actor(), OBS, OBS, ACT, "cpu"
    )


def bandit_batch(n: int = 256, bootstrap: float = 0.0) -> SimpleNamespace:
    """Transitions with a known optimal Q: terminal steps, so Q*(s, a) = r(s, a)."""
    obs = torch.randn(n, OBS)
    actions = torch.rand(n, ACT) * 2 - 1
    rewards = torch.tanh(obs[:, 0]) + 0.5 * actions[:, 0] * obs[:, 1]
    return SimpleNamespace(
        obs=obs,
        critic_obs=obs,
        actions=actions,
        rewards=rewards,
        next_obs=torch.randn(n, OBS),
        next_critic_obs=torch.randn(n, OBS),
        bootstrap=torch.full((n,), bootstrap),
        discount=torch.full((n,), 0.99),
        k=torch.ones(n),
    )
