"""The "where to change X" recipes of docs/DESIGN.md hold: a critic family and a simulator backend
registered through the public extension points are selected by their YAML, validated, built and
trained."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from backend_helpers import CONSTANT_SPEC, CONSTANT_TASK, ConstantEnv
from cli_helpers import NO_EXPORT, SMALL
from torch import nn

import fast_lora_td3
from fast_lora_td3.algos import make_learner
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.validate import validate
from fast_lora_td3.envs.backends import BACKEND_TABLE
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn import EnsembleLinear
from fast_lora_td3.nn.config import CriticConfig
from fast_lora_td3.nn.critic import CRITIC_FAMILIES
from fast_lora_td3.training.trainer import Trainer

FAMILY = "tiny_test_family"
BACKEND = "tiny_test_backend"
OBS, ACT = 5, 2


def build_tiny(cfg: CriticConfig, in_dim: int, num_atoms: int) -> nn.Module:
    """One hidden ensemble layer: [.., in_dim] → [E, B, num_atoms]."""
    (hidden,) = cfg.hidden_dims
    e = cfg.num_members
    return nn.Sequential(
        EnsembleLinear(in_dim, hidden, ensemble_size=e),
        nn.Tanh(),
        EnsembleLinear(hidden, num_atoms, ensemble_size=e),
    )


def validate_tiny(cfg: CriticConfig) -> None:
    if len(cfg.hidden_dims) != 1:
        raise ConfigError(f"critic.hidden_dims={list(cfg.hidden_dims)} must hold one width")


@pytest.fixture
def tiny_family(tmp_path: Path) -> Iterator[list[str]]:
    """Register the family and write its YAML; yields the overrides that select it."""
    fast_lora_td3.register_critic_family(FAMILY, build_tiny, validate_tiny)
    (tmp_path / "critic").mkdir()
    (tmp_path / "critic" / f"{FAMILY}.yaml").write_text(f"family: {FAMILY}\nhidden_dims: [16]\n")
    try:
        yield [f"critic={FAMILY}", f"hydra.searchpath=[file://{tmp_path}]"]
    finally:
        del CRITIC_FAMILIES[FAMILY]


def test_registered_critic_family_builds_and_trains_from_a_config(tiny_family: list[str]) -> None:
    cfg = compose_config([*SMALL, *tiny_family])
    assert (cfg.critic.family, cfg.critic.hidden_dims) == (FAMILY, [16])
    validate(cfg)  # the run-level checks accept the new family
    torch.manual_seed(0)
    learner = make_learner(cfg.algo, cfg.critic, cfg.actor, OBS, OBS, ACT, "cpu")
    critic = learner.critic
    assert critic.family == FAMILY and isinstance(critic.net[0], EnsembleLinear)
    atoms = cfg.algo.num_atoms

    obs, actions = torch.randn(8, OBS), torch.rand(8, ACT) * 2 - 1
    target = torch.softmax(torch.randn(8, atoms), dim=-1)
    before = [p.detach().clone() for p in critic.parameters()]
    logits = critic(obs, actions)
    assert logits.shape == (cfg.critic.num_members, 8, atoms)
    loss = -(target * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    learner.critic_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    learner.critic_optimizer.step()  # the learner put the new family's parameters in its optimiser
    assert all(not torch.equal(b, p) for b, p in zip(before, critic.parameters(), strict=True))
    assert -(target * torch.log_softmax(critic(obs, actions), -1)).sum(-1).mean() < loss


def test_registered_family_checks_run_on_the_config_path(tiny_family: list[str]) -> None:
    cfg = compose_config([*SMALL, *tiny_family, "critic.hidden_dims=[16,16]"])
    with pytest.raises(ConfigError, match=r"critic\.hidden_dims=\[16, 16\] must hold one width"):
        validate(cfg)


def test_unknown_family_error_lists_the_registered_ones(tiny_family: list[str]) -> None:
    cfg = compose_config([*SMALL, "critic.family=nope"])
    with pytest.raises(ConfigError, match=rf"critic\.family='nope'.*mlp_lora, {FAMILY}"):
        validate(cfg)
    with pytest.raises(ValueError, match="already registered"):
        fast_lora_td3.register_critic_family(FAMILY, build_tiny)


@pytest.fixture
def tiny_backend(tmp_path: Path) -> Iterator[list[str]]:
    """Register the backend and write its env YAML; yields the overrides that select it."""
    fast_lora_td3.register_backend(BACKEND, CONSTANT_SPEC)
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / f"{BACKEND}.yaml").write_text(
        f"backend: {BACKEND}\ntask: {CONSTANT_TASK}\n"
    )
    try:
        yield [f"env={BACKEND}", f"hydra.searchpath=[file://{tmp_path}]"]
    finally:
        del BACKEND_TABLE[BACKEND]


def test_registered_backend_builds_from_a_config_and_trains(
    tiny_backend: list[str], tmp_path: Path
) -> None:
    point_mass = ("env.backend=", "env.task=")  # the small run's env, replaced by the YAML's
    small = [o for o in NO_EXPORT if not o.startswith(point_mass)]
    cfg = compose_config([*small, *tiny_backend, "total_steps=320"])
    assert (cfg.env.backend, cfg.env.task, cfg.env.num_envs) == (BACKEND, CONSTANT_TASK, 8)
    validate(cfg)  # the run-level checks accept the new backend
    env = fast_lora_td3.make_env(cfg.env)
    assert isinstance(env, ConstantEnv) and env.num_envs == 8
    env.close()

    trainer = Trainer(cfg, tmp_path / "run")
    try:
        row = trainer.train()
    finally:
        trainer.close()
    assert trainer.env_steps == 320 and trainer.update_step.num_critic_updates > 0
    # every 3-step episode of reward 1 returns 3: training and evaluation ran on the new backend
    assert row["episode_return"] == 3.0 and row["eval_return"] == 3.0


def test_unregistered_backend_error_lists_the_registered_ones(tiny_backend: list[str]) -> None:
    with pytest.raises(ConfigError, match=rf"env\.backend='nope'.*'dummy', '{BACKEND}'"):
        compose_config([*SMALL, "env.backend=nope"])
