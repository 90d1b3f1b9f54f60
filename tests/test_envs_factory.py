"""The backend table: every built-in backend resolves, and a backend registered from outside the
package is built, validated and listed like the built-in ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fast_lora_td3.envs import (
    BACKEND_TABLE,
    BackendSpec,
    EnvConfig,
    StepResult,
    VecEnv,
    backend_names,
    make_env,
    register_backend,
)
from fast_lora_td3.envs.factory import backend_class
from fast_lora_td3.errors import ConfigError


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
        return ("Constant-v0",)

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


@pytest.fixture
def constant_backend() -> str:
    register_backend("constant", BackendSpec(__name__, "ConstantEnv", "torch", "pip install torch"))
    yield "constant"
    del BACKEND_TABLE["constant"]


def test_builtin_backends_resolve_without_building() -> None:
    assert backend_names() == ["mjlab", "isaaclab", "gymnasium", "dummy"]
    for name in ("isaaclab", "gymnasium", "dummy"):  # mjlab's module imports mjlab: tested there
        cls = backend_class(name)
        assert callable(cls.task_ids)
    assert backend_class("isaaclab").task_ids() is None  # checked once the Kit app runs
    assert "PointMass-v0" in backend_class("dummy").task_ids()


def test_registered_backend_is_built_and_validated(constant_backend: str, make_collector) -> None:
    env = make_env(EnvConfig(backend=constant_backend, task="Constant-v0", num_envs=2))
    assert isinstance(env, VecEnv) and constant_backend in backend_names()
    collector = make_collector(env)
    for _ in range(6):
        collector.step()
    stats = collector.episode_tracker.pop()
    assert stats is not None and int(stats["count"]) == 4 and stats["mean_return"].item() == 3.0
    with pytest.raises(ConfigError, match=r"did you mean one of \['Constant-v0'\]"):
        make_env(EnvConfig(backend=constant_backend, task="Constant-v1", num_envs=2))
    with pytest.raises(ConfigError, match=r"use one of .*'constant'"):
        make_env(EnvConfig(backend="constants", task="Constant-v0"))


def test_registered_backend_names_its_missing_package() -> None:
    spec = BackendSpec(__name__, "ConstantEnv", "no_such_simulator_pkg", "pip install nosuch")
    register_backend("missing", spec)
    try:
        with pytest.raises(ConfigError, match=r"'no_such_simulator_pkg'.*pip install nosuch"):
            make_env(EnvConfig(backend="missing", task="Constant-v0", num_envs=2))
    finally:
        del BACKEND_TABLE["missing"]


def test_register_backend_needs_a_spec() -> None:
    with pytest.raises(TypeError, match="BackendSpec"):
        register_backend("bad", ("module", "Class"))  # type: ignore[arg-type]
