"""The command line: Isaac Lab flags in any position, `--help` generated from the config
docstrings, Hydra's `--cfg job`, and what `--num_envs` means to `play`."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml
from cli_helpers import SMALL, cli

from fast_lora_td3 import cli as cli_module
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.deploy.export import ExportArgs
from fast_lora_td3.deploy.inference import COMMAND_KEYS
from fast_lora_td3.deploy.play import PlayArgs

ROOT = Path(__file__).resolve().parents[1]
BASE = ["env.backend=dummy", "seed=3"]
"""Two ordinary overrides the flags are placed before, between and after."""
VALUE_FLAGS = [
    ("--task", "T-v0", "env.task=T-v0"),
    ("--num_envs", "64", "env.num_envs=64"),
    ("--seed", "7", "seed=7"),
    ("--device", "cpu", "device=cpu"),
    ("--checkpoint", "runs/r", "checkpoint=runs/r"),
]
SWITCHES = [
    ("--video", ["env.video=true"]),
    ("--resume", ["resume=true"]),
    ("--verify-compile", ["verify_compile=true"]),
    ("--headless", []),
]


def _at(position: int, words: list[str]) -> list[str]:
    """BASE with `words` inserted first (0), in the middle (1) or last (2)."""
    return [*BASE[:position], *words, *BASE[position:]]


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Replace the train / play / export handlers by one that records its overrides."""
    seen: dict[str, list[str]] = {}
    for name in ("train", "play", "export"):

        def handler(overrides: list[str], name: str = name) -> int:
            seen[name] = overrides
            return 0

        monkeypatch.setitem(cli_module.COMMANDS, name, (handler, cli_module.COMMANDS[name][1]))
    return seen


def test_every_documented_flag_is_tested() -> None:
    assert {f for f, _, _ in VALUE_FLAGS} == set(cli_module.ALIASES)
    assert {f for f, _ in SWITCHES} == set(cli_module.FLAG_ALIASES)


@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("joined", [False, True], ids=["space", "equals"])
@pytest.mark.parametrize(("flag", "value", "override"), VALUE_FLAGS)
@pytest.mark.parametrize("command", ["train", "play", "export"])
def test_value_flags_in_any_position(
    recorded: dict, command: str, flag: str, value: str, override: str, joined: bool, position: int
) -> None:
    words = [f"{flag}={value}"] if joined else [flag, value]
    assert cli_module.main([command, *_at(position, words)]) == 0
    assert recorded[command] == _at(position, [override])


@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize(("flag", "overrides"), SWITCHES)
def test_switches_in_any_position(
    recorded: dict, flag: str, overrides: list[str], position: int
) -> None:
    assert cli_module.main(["train", *_at(position, [flag])]) == 0
    assert recorded["train"] == _at(position, overrides)


def test_isaac_lab_order_of_flags(recorded: dict) -> None:
    argv = ["train", "--task", "X", "--num_envs", "64", "--headless", "--seed=2"]
    assert cli_module.main(argv) == 0
    assert recorded["train"] == ["env.task=X", "env.num_envs=64", "seed=2"]


def test_isaac_lab_command_line_runs(tmp_path: Path) -> None:
    """The issue's command line, flags first, through the real console entry point."""
    flags = ["--task", "PointMassAsym-v0", "--num_envs", "8", "--headless", "--seed=4"]
    res = cli("train", *flags, "env.backend=dummy", "device=cpu", "dry_run=true", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "env=dummy:PointMassAsym-v0 num_envs=8" in res.stdout, res.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["train", "--task"], "--task needs a value"),
        (["train", "--num_envs", "--headless"], "--num_envs needs a value"),
        (["train", "--tsk", "X"], "unknown option '--tsk'"),
        (["train", "--cfg", "hydra"], "use --cfg job"),
        (["play", "--cfg", "job"], "--cfg job is a train option"),
    ],
)
def test_bad_flags_are_one_line(
    recorded: dict, capsys: pytest.CaptureFixture, argv: list[str], needle: str
) -> None:
    assert cli_module.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not recorded


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _help(capsys: pytest.CaptureFixture, command: str) -> dict[str, str]:
    """`command --help` as key → description (the lines `  key=default  description`); the
    group lines (`  algo=fastsac|fasttd3|ppo  …`) also under their full head."""
    assert cli_module.main([command, "--help"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        head, _, doc = line.strip().partition("  ")
        if "=" in head and line.startswith("  "):
            rows[head.split("=", 1)[0]] = rows[head] = doc.strip()
    return rows


def test_train_help_lists_every_field_with_its_docstring(capsys: pytest.CaptureFixture) -> None:
    rows = _help(capsys, "train")
    keys = _leaf_keys(TrainConfig)
    assert len(keys) > 100
    for key in keys:
        assert rows.get(key), f"{key} missing or undocumented in `train --help`"
    assert rows["algo.gamma"] == "Discount per environment step."
    assert rows["algo=fastsac|fasttd3|ppo"].startswith("Algorithm")
    assert "cartpole_cpu" in rows["experiment"]  # the presets are listed


@pytest.mark.parametrize(
    ("command", "args", "config_keys"),
    [
        ("play", PlayArgs, ["env.num_envs", "env.task", "eval.num_envs", "eval.max_steps", "seed"]),
        ("export", ExportArgs, ["env.task", "device"]),
    ],
)
def test_play_and_export_help_list_their_keys(
    capsys: pytest.CaptureFixture, command: str, args: type, config_keys: list[str]
) -> None:
    rows = _help(capsys, command)
    for key in [f.name for f in dataclasses.fields(args)] + config_keys:
        assert rows.get(key), f"{key} missing or undocumented in `{command} --help`"
    if command == "play":
        assert "eval.num_envs" in rows["env.num_envs"]  # play's own meaning of the key


def test_command_keys_are_the_documented_ones() -> None:
    documented = {f.name for cls in (PlayArgs, ExportArgs) for f in dataclasses.fields(cls)}
    assert documented == set(COMMAND_KEYS)


def test_cfg_job_prints_the_composed_config_and_builds_nothing(tmp_path: Path) -> None:
    res = cli("train", "experiment=cartpole_cpu", "--cfg", "job", "seed=5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    printed = yaml.safe_load(res.stdout)
    preset = yaml.safe_load((ROOT / "configs" / "experiment" / "cartpole_cpu.yaml").read_text())
    assert printed["env"]["task"] == preset["env"]["task"]
    assert printed["seed"] == 5 and printed["experiment"] == "cartpole_cpu"
    assert set(printed) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert list(tmp_path.iterdir()) == []  # no run directory, no logs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few seconds of training on the point mass (eval.num_envs=2, env.num_envs=8)."""
    tmp = tmp_path_factory.mktemp("cli")
    run = tmp / "run"
    res = cli("train", *SMALL, "total_steps=80", "export_at_end=false", f"run_dir={run}", cwd=tmp)
    assert res.returncode == 0, res.stderr
    return run


def test_play_flags_first_and_num_envs_is_what_play_runs(run_dir: Path) -> None:
    res = cli("play", "--num_envs", "3", "--headless", f"--checkpoint={run_dir}", cwd=run_dir)
    assert res.returncode == 0, res.stderr
    assert "(3 envs)" in res.stdout, res.stdout


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [([], "(2 envs)"), (["num_envs=5"], "(5 envs)"), (["eval.num_envs=4"], "(4 envs)")],
)
def test_play_num_envs(
    run_dir: Path, capsys: pytest.CaptureFixture, overrides: list[str], expected: str
) -> None:
    assert cli_module.main(["play", f"checkpoint={run_dir}", *overrides]) == 0
    assert expected in capsys.readouterr().out


def test_play_num_envs_and_eval_num_envs_disagreeing_is_one_line(
    run_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["play", f"checkpoint={run_dir}", "--num_envs", "3", "eval.num_envs=4"]
    assert cli_module.main(argv) == 2
    err = capsys.readouterr().err
    assert "env.num_envs=3" in err and "eval.num_envs=4" in err and len(err.splitlines()) == 1


def test_a_mistyped_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_module.main(["trian"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert "invalid choice: 'trian'" in err[0] and "'train'" in err[0]


def test_a_dry_run_checks_the_task_id(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "env.backend=dummy", "dry_run=true"]
    assert cli_module.main([*base, "--task=Nope-v0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.task='Nope-v0'" in err[0] and "PointMass-v0" in err[0]
    assert cli_module.main([*base, "--task=PointMass-v0"]) == 0
