"""Every field of every config group rejects wrong values with one line naming it (README, "Bad
input"): the test walks the schema, draws wrong values from each field's declared `Valid` and its
type, and feeds them through the train command's composition and validation; a few go through the
real CLI to prove exit 2, one stderr line, no traceback and no run directory end to end."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import NO_EXPORT, REPO, cli

from fast_lora_td3.cli import main as cli_main
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import validate
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.fields import Valid, field_type, valid_of

EXEMPT = {
    "env.task": "any id may be registered; the backend checks it when the env is made",
    "experiment": "informational: the name of the preset that was applied",
    "run_dir": "a path: tested below (test_bad_paths_are_one_line_and_leave_no_run_dir)",
    "checkpoint": "a path: checked when the checkpoint is read (test_checkpoint.py)",
}
"""Fields for which every value of their type is valid: only the type probe applies to them."""


def walk(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, Any, bool, Valid]]:
    """(dotted key, type, None allowed, Valid) of every leaf field of `cls`, recursively."""
    out = []
    for f in dataclasses.fields(cls):
        tp, optional = field_type(cls, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += walk(tp, f"{key}.")
        else:
            out.append((key, tp, optional, valid_of(f)))
    return out


FIELDS = walk()


def out_of_range(tp: Any, spec: Valid) -> list[float]:
    """Numbers just outside the declared range, plus -1 and 0 where those are invalid."""
    step = 1 if tp is int else 0.5
    edges = [
        *([spec.ge - step] if spec.ge is not None else []),
        *([spec.gt, spec.gt - step] if spec.gt is not None else []),
        *([spec.le + step] if spec.le is not None else []),
        *([spec.lt, spec.lt + step] if spec.lt is not None else []),
        *[x for x in (-1, 0) if not spec.in_range(x)],
    ]
    return sorted({tp(x) for x in edges})


def wrong_values(tp: Any, optional: bool, spec: Valid) -> list[Any]:
    """Python values that must be rejected (the type probes go through Hydra separately)."""
    if typing.get_origin(tp) is list:
        item = typing.get_args(tp)[0]
        n = spec.length or 1
        bad: list[Any] = [5, "x"]
        if spec.min_len or spec.length:
            bad.append([])
        if spec.length:
            bad.append([0.5] * (spec.length - 1))
        if item in (int, float):
            bad += [[x] * n for x in out_of_range(item, spec)]
            bad += [["x"] * n, [True] * n]
        if item is float:
            bad += [[x] * n for x in (math.nan, math.inf)]
        return bad
    if tp is bool:
        return ["maybe", 1, [True]]
    if tp in (int, float):
        bad = ["x", [1], True, *out_of_range(tp, spec)]
        return [*bad, 1.5] if tp is int else [*bad, math.nan, math.inf, -math.inf]
    assert tp is str, tp
    if spec.free:
        return [["a"], 5]
    bad = [["a"], 5]
    candidates = ["no_such_value", "", "a/b"]
    return (
        bad
        + [
            c
            for c in candidates
            if (spec.options() and c not in spec.options())
            or (spec.pattern and not re.fullmatch(spec.pattern, c))
            or (not spec.options() and not spec.pattern and c == "no_such_value")
        ][:2]
    )


@pytest.fixture(scope="module")
def base() -> TrainConfig:
    return compose_config([])


def _set(cfg: TrainConfig, key: str, value: Any) -> None:
    *groups, name = key.split(".")
    node = cfg
    for g in groups:
        node = getattr(node, g)
    setattr(node, name, value)


def _one_line(exc: pytest.ExceptionInfo, key: str) -> None:
    message = str(exc.value)
    assert "\n" not in message and key in message, message


def test_the_walk_covers_every_group_and_the_exempt_list_is_exact() -> None:
    keys = {key for key, *_ in FIELDS}
    assert (
        len(keys) > 90
        and {"algo.gamma", "critic.rank", "env.num_envs", "ppo.learning_rate"} <= keys
    )
    assert {key for key, *_, spec in FIELDS if spec.free} == set(EXEMPT)


@pytest.mark.parametrize(("key", "tp", "optional", "spec"), FIELDS, ids=[f[0] for f in FIELDS])
def test_every_field_rejects_wrong_values_with_one_line(
    base: TrainConfig, key: str, tp: Any, optional: bool, spec: Valid
) -> None:
    """Wrong type, NaN/inf, negative, zero, out of range, empty list, list where a scalar goes
    (and a scalar where a list goes): validate, as `train` runs it, names the field in one line."""
    values = wrong_values(tp, optional, spec)
    assert values, key
    for value in values:
        cfg = copy.deepcopy(base)
        _set(cfg, key, value)
        with pytest.raises(ConfigError) as info:
            validate(cfg)
        _one_line(info, key)


def _hydra_probes() -> list[tuple[str, str]]:
    """One override per field that only Hydra's typed merge can reject (a list where a scalar
    goes, a scalar where a list goes, text where a number goes)."""
    out = []
    for key, tp, _, _ in FIELDS:
        if key == "experiment":  # `experiment=` also selects a preset group: tested below
            continue
        if typing.get_origin(tp) is list:
            out.append((key, "5"))
        else:
            out.append((key, "[1]"))
        if tp in (int, float, bool):
            out.append((key, "abc"))
    return out


@pytest.mark.parametrize(("key", "value"), _hydra_probes(), ids=lambda v: str(v))
def test_hydra_type_errors_name_the_key_the_type_and_the_value(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config([f"{key}={value}"])
    _one_line(info, f"{key}={value}")
    assert " use " in str(info.value), info.value  # says what would be valid


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("total_steps=1e6", ["total_steps=1e6", "an int", "got float"]),
        ("algo.critic_lr=nan", ["algo.critic_lr=nan", "finite"]),
        ("experiment=nosuch", ["experiment=nosuch", "cartpole_cpu", "pendulum_cpu"]),
        ("critic=nosuch", ["critic=nosuch", "simbav2_lora"]),
        ("nosuch=1", ["'nosuch'", "total_steps"]),
        ("+nosuch=1", ["'nosuch'", "total_steps"]),
        ("++nosuch=1", ["'nosuch'", "total_steps"]),
        ("++algo.nosuch=1", ["'algo.nosuch'", "critic_lr"]),
        ("+env.nosuch.deep=1", ["'env.nosuch'", "num_envs"]),
    ],
)
def test_hydra_name_errors_list_what_is_valid(override: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in needles), message
    assert "+nosuch" not in message  # no hint to add the key with `+`: it would not be read


def test_a_type_error_shows_the_failing_override_not_an_earlier_one() -> None:
    with pytest.raises(ConfigError, match=r"^total_steps=1e6 is not valid: use an int"):
        compose_config(["total_steps=64", "total_steps=1e6"])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algo.std_min=0.5", "algo.std_max=0.1"], "algo.std_min=0.5"),
        (["algo.lr_min=0.01"], "algo.lr_min=0.01"),
        (["total_steps=100", "env.num_envs=128"], "env.num_envs=128"),
        (["algo=ppo", "total_steps=1000", "env.num_envs=64"], "ppo.num_steps_per_env"),
    ],
)
def test_rules_between_fields_name_both(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")) as info:
        validate(compose_config(overrides))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs" / "experiment").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_preset_and_the_defaults_stay_valid(path: Path) -> None:
    validate(compose_config([f"experiment={path.stem}"]))
    validate(compose_config([]))


def _assert_clean(result: Any, needle: str, root: Path) -> None:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in lines[0], lines[0]
    runs = [p for p in (root / "logs").rglob("*") if p.is_dir()] if (root / "logs").exists() else []
    assert not runs, runs  # nothing written: no run directory


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algo.critic_lr=-1e-3"], "algo.critic_lr"),
        (["algo.betas=[0.9]"], "algo.betas"),
        (["total_steps=1e6"], "total_steps"),
        (["+algo.nosuch=1"], "algo.nosuch"),
        (["total_steps=4"], "total_steps"),
    ],
)
def test_through_the_cli_exit_2_one_line_no_run_dir(
    tmp_path: Path, overrides: list[str], needle: str
) -> None:
    result = cli("train", *NO_EXPORT, *overrides, f"log_dir={tmp_path / 'logs'}", cwd=tmp_path)
    _assert_clean(result, needle, tmp_path)


def _main(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    code = cli_main(args)
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip()]


def test_bad_paths_are_one_line_and_leave_no_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A path under a regular file, a file where a directory goes, and one no process can create
    (under /proc, which refuses even root) are one line naming the setting; a start that fails
    after making its run directory removes it."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    logs = tmp_path / "logs"
    cases = [
        (f"log_dir={afile}/x", "log_dir="),
        (f"log_dir={afile}", "log_dir="),
        ("log_dir=/proc/fast_lora_td3_no_such_dir", "log_dir="),
        (f"run_dir={afile}/x", "run_dir="),
        (f"run_dir={afile}", "run_dir="),
        ("run_dir=/proc/fast_lora_td3_no_such_dir", "run_dir="),
        (f"log_dir={logs} env.task=NoSuchTask-v0", "env.task"),
        (f"run_dir={tmp_path / 'fresh'} env.task=NoSuchTask-v0", "env.task"),
    ]
    for case, needle in cases:
        code, lines = _main(["train", *NO_EXPORT, "total_steps=16", *case.split()], capsys)
        assert code == 2 and len(lines) == 1 and needle in lines[0], (case, lines)
    assert not any(p.is_dir() for p in logs.rglob("*")), list(logs.rglob("*"))
    assert not (tmp_path / "fresh").exists()
    assert afile.read_text() == "not a directory"


def test_export_out_that_cannot_be_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    code, _ = _main(["train", *NO_EXPORT, "total_steps=16", f"run_dir={run}"], capsys)
    assert code == 0
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "x", Path("/proc/fast_lora_td3_no_such_dir")):
        code, lines = _main(["export", f"checkpoint={run}", f"out={out}"], capsys)
        assert code == 2 and len(lines) == 1 and "out=" in lines[0], lines
