"""The Isaac Lab G1 task matches the mjlab G1 task term by term (names, functions, weights, order).

Read from tasks/isaaclab_g1.py by AST (Isaac Lab cannot be imported here); that every Isaac Lab
function and parameter exists is tests/test_isaaclab_conformance.py's job.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import fast_lora_td3.tasks.isaaclab_g1 as g1
from fast_lora_td3.tasks import g1_rewards as r

SOURCE = Path(g1.__file__).read_text(encoding="utf-8")
pytestmark = pytest.mark.mjlab


def _class_terms(name: str) -> dict[str, ast.Call]:
    """Terms (attribute → ``XTerm(...)`` call) of the config class ``name`` inside ``_build``."""
    cls = next(
        n for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.ClassDef) and n.name == name
    )
    return {
        n.targets[0].id: n.value
        for n in cls.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
    }


def _func(call: ast.Call) -> str:
    expr = next(k.value for k in call.keywords if k.arg == "func")
    return f"isaaclab.envs.mdp:{expr.attr}" if isinstance(expr, ast.Attribute) else expr.id


@pytest.fixture(scope="module")
def mjlab_cfg():
    from fast_lora_td3.tasks.g1_velocity import fastlora_g1_env_cfg

    return fastlora_g1_env_cfg()


def test_rewards_correspond(mjlab_cfg) -> None:
    isaac = _class_terms("RewardsCfg")
    assert list(isaac) == list(mjlab_cfg.rewards) == list(g1.REWARD_TERMS)
    for name, call in isaac.items():
        assert _func(call) == g1.REWARD_TERMS[name]
        weight = next(k.value for k in call.keywords if k.arg == "weight")
        assert ast.unparse(weight) == f"w[{name!r}]"  # the shared REWARD_WEIGHTS entry
        assert mjlab_cfg.rewards[name].weight == r.REWARD_WEIGHTS[name]


def test_observations_correspond(mjlab_cfg) -> None:
    actor, critic = (list(mjlab_cfg.observations[g].terms) for g in ("actor", "critic"))
    policy = _class_terms("PolicyCfg")
    assert list(policy) == actor
    assert [*policy, *_class_terms("CriticCfg")] == critic  # CriticCfg(PolicyCfg) + base_lin_vel
    for name, call in {**policy, **_class_terms("CriticCfg")}.items():
        assert _func(call) == g1.OBSERVATION_TERMS[name]


def test_own_term_params_match_their_functions() -> None:
    for cls in ("RewardsCfg", "PolicyCfg"):
        for call in _class_terms(cls).values():
            fn = _func(call)
            params = next((k.value for k in call.keywords if k.arg == "params"), None)
            if ":" in fn or not isinstance(params, ast.Dict):
                continue  # Isaac Lab functions: checked against the wheel by the conformance test
            accepted = set(inspect.signature(getattr(g1, fn)).parameters) - {"env"}
            assert {k.value for k in params.keys} <= accepted, fn


def test_randomisation_events_are_created_not_modified() -> None:
    """G1RoughEnvCfg.__post_init__ sets push_robot / add_base_mass to None: we build them."""
    built = {
        ast.unparse(n.targets[0]): n.value
        for n in ast.walk(ast.parse(SOURCE))
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).startswith("ev.")
    }
    assert set(built) == {
        "ev.push_robot",
        "ev.add_base_mass",
        "ev.physics_material",
        "ev.actuator_gains",
    }
    assert all(
        isinstance(v, ast.Call) and ast.unparse(v.func) == "EventTerm" for v in built.values()
    )
    assert "interval_range_s=(5.0, 10.0)" in ast.unparse(built["ev.push_robot"])
    assert not [
        n for n in ast.walk(ast.parse(SOURCE)) if ast.unparse(n) == "ev.push_robot.interval_range_s"
    ]
