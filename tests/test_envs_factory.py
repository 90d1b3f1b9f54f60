"""The backend table: every built-in backend resolves, and a backend registered from outside the
package is built, validated and listed like the built-in ones."""

from __future__ import annotations

import dataclasses

import pytest
from backend_helpers import CONSTANT_SPEC

from fast_lora_td3.envs import (
    BACKEND_TABLE,
    EnvConfig,
    VecEnv,
    backend_names,
    make_env,
    register_backend,
)
from fast_lora_td3.envs.factory import backend_class
from fast_lora_td3.errors import ConfigError


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
    spec = dataclasses.replace(
        CONSTANT_SPEC, package="no_such_simulator_pkg", install_hint="pip install nosuch"
    )
    register_backend("missing", spec)
    try:
        with pytest.raises(ConfigError, match=r"'no_such_simulator_pkg'.*pip install nosuch"):
            make_env(EnvConfig(backend="missing", task="Constant-v0", num_envs=2))
    finally:
        del BACKEND_TABLE["missing"]


def test_register_backend_needs_a_spec() -> None:
    with pytest.raises(TypeError, match="BackendSpec"):
        register_backend("bad", ("module", "Class"))  # type: ignore[arg-type]
