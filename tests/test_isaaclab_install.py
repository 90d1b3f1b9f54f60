"""Install routes: mjlab and Isaac Lab never share an environment, and the README's first command
still installs mjlab. Read from pyproject.toml and the real wheels' metadata (no resolver run here;
scripts/isaaclab_resolve.py runs pip's resolver, a few minutes)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import tomllib
from cli_helpers import load_script
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
conformance = load_script("isaaclab_conformance")


def _names(reqs: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in reqs}


def test_extras_separate_the_simulators() -> None:
    extras = PROJECT["optional-dependencies"]
    assert "mjlab" not in _names(PROJECT["dependencies"])
    assert _names(extras["mjlab"]) == {"mjlab"}
    dev = [Requirement(r) for r in extras["dev"]]
    assert any(r.name == "fast_lora_td3" and r.extras == {"mjlab"} for r in dev)  # `.[dev]` → mjlab
    isaac = [Requirement(r) for r in extras["isaaclab"]]
    assert [(r.name, str(r.specifier)) for r in isaac] == [("isaaclab", "==2.3.2.post1")]
    assert "mjlab" not in _names(extras["isaaclab"])


def _wheel_requires() -> list[Requirement]:
    try:
        src = conformance.fetch_source("2.3")
    except Exception as exc:
        pytest.skip(f"isaaclab 2.3 wheel not downloadable ({exc})")
    meta = next(src.glob("isaaclab-*.dist-info")) / "METADATA"
    lines = meta.read_text(encoding="utf-8").splitlines()
    return [Requirement(x.split(":", 1)[1]) for x in lines if x.startswith("Requires-Dist:")]


def test_core_dependencies_admit_isaaclab_pins() -> None:
    """Every package Isaac Lab 2.3.2 pins exactly must be allowed by our core requirements."""
    pins = {
        r.name.lower(): next(iter(r.specifier)).version
        for r in _wheel_requires()
        if len(r.specifier) == 1
        and next(iter(r.specifier)).operator == "=="
        and (r.marker is None or r.marker.evaluate({"extra": "all"}))
    }
    ours = {Requirement(r).name.lower(): Requirement(r).specifier for r in PROJECT["dependencies"]}
    shared = set(pins) & set(ours)
    assert "gymnasium" in shared  # isaaclab pins gymnasium==1.2.0
    for name in shared:
        assert ours[name].contains(pins[name], prereleases=True), (name, pins[name])


def test_mjlab_and_isaaclab_pin_different_rsl_rl() -> None:
    """Why the extras are separate: the two simulators pin incompatible rsl-rl-lib versions."""
    isaac = {
        str(r.specifier)
        for r in _wheel_requires()
        if r.name == "rsl-rl-lib" and r.marker is not None and r.marker.evaluate({"extra": "all"})
    }
    mjlab = {
        str(Requirement(r).specifier)
        for r in importlib.metadata.requires("mjlab") or []
        if Requirement(r).name == "rsl-rl-lib"
    }
    assert isaac == {"==3.0.1"} and mjlab and mjlab.isdisjoint(isaac)
