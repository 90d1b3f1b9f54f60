"""Shared test set-up: tiny networks run fastest single-threaded on the 2-core CI machine."""

import os

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- Collector factory (env layer / issue 11): shared by the env and collector tests ------------


@pytest.fixture
def make_collector():
    """``make_collector(env, seed)``: a ``Collector`` over ``env`` with a tiny FastTD3 learner and
    a small replay (episode statistics do not depend on the policy)."""
    from fast_lora_td3.algos import AlgoConfig, make_learner
    from fast_lora_td3.nn import ActorConfig, CriticConfig
    from fast_lora_td3.replay.buffer import ReplayBuffer
    from fast_lora_td3.training.collector import Collector

    def make(env, seed: int = 0) -> Collector:
        learner = make_learner(
            AlgoConfig(num_atoms=21, batch_size=16),
            CriticConfig(family="mlp", hidden_dims=[16, 16]),
            ActorConfig(hidden_dims=[16, 16]),
            env.obs_dim,
            env.critic_obs_dim,
            env.action_dim,
            env.device,
        )
        replay = ReplayBuffer(
            env.num_envs,
            8,
            env.obs_dim,
            env.action_dim,
            critic_obs_dim=env.critic_obs_dim if env.has_critic_obs else 0,
            device=env.device,
            max_episode_length=env.max_episode_length,
        )
        return Collector(env, replay, learner, seed=seed)

    return make


# --- A tiny registered backend: shared by the backend-table and extension-point tests ----------


@pytest.fixture
def constant_backend():
    """Register `backend_helpers.ConstantEnv` as env.backend=constant; yields the name."""
    from backend_helpers import CONSTANT_SPEC

    from fast_lora_td3.envs import BACKEND_TABLE, register_backend

    register_backend("constant", CONSTANT_SPEC)
    try:
        yield "constant"
    finally:
        del BACKEND_TABLE["constant"]
