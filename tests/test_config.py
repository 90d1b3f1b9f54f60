"""Config checks live on the dataclass that owns the field; YAML holds only what differs; resume keys exist."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fast_lora_td3.algos import LEARNERS
from fast_lora_td3.algos.config import ALGO_NAMES, AlgoConfig
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.config.cpu_defaults import SIZED_KEYS
from fast_lora_td3.config.schema import TrainConfig
from fast_lora_td3.config.validate import validate
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import ActorConfig, CriticConfig
from fast_lora_td3.runs.checkpoint_state import RESUME_MUTABLE_KEYS, _ignored, flatten_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
GROUPS = {"algo": AlgoConfig, "critic": CriticConfig, "actor": ActorConfig, "env": EnvConfig}

BAD = [
    (["algo=nosuch"], "algo"),
    (["algo.gamma=0"], "algo.gamma"),
    (["algo.tau=2"], "algo.tau"),
    (["algo.buffer_size=4"], "algo.buffer_size=4"),
    (["algo.num_atoms=1"], "algo.num_atoms"),
    (["algo.actor_q_reduce=max"], "algo.actor_q_reduce"),
    (["algo.actor_preact_l2=-1"], "algo.actor_preact_l2"),
    (["algo=fastsac", "algo.actor_preact_l2=0.01"], "algo.actor_preact_l2=0.01 is a FastTD3"),
    (["algo.replay_obs_dtype=float16"], "algo.replay_obs_dtype='float16'"),
    (["algo.replay_action_dtype=int8"], "algo.replay_action_dtype"),
    (["algo.v_min=5", "algo.v_max=1"], "algo.v_min"),
    (["critic.family=transformer"], "critic.family"),
    (["critic=simbav2_lora", "critic.rank=600"], "critic.rank=600"),
    (["critic=simbav2_lora", "critic.weight_norm=both"], "critic.weight_norm"),
    (["actor.family=rnn"], "actor.family"),
    (["env.backend=bullet"], "env.backend"),
    (["env.action_clip=0"], "env.action_clip"),
    (["eval.num_envs=0"], "eval.num_envs"),
    (["amp=fp16"], "amp='fp16'"),
    (["compile=maybe"], "compile"),
    (["logger=csv"], "logger"),
    (["nan_action=ignore"], "nan_action"),
    (["total_steps=0"], "total_steps"),
    (["log_interval=0"], "log_interval"),
]


@pytest.mark.parametrize(("overrides", "needle"), BAD)
def test_composed_config_checks_each_field_once(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")) as info:
        validate(compose_config(overrides))  # a family's own rules run in validate (critic table)
    assert "\n" not in str(info.value)


def test_checks_run_on_the_final_values_after_construction() -> None:
    """Fields changed after construction (the CPU defaults do) are checked again by `validate`."""
    cfg = compose_config(["experiment=cartpole_cpu"])
    validate(cfg)
    bad = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo))
    bad.algo.gamma = 1.5
    with pytest.raises(ConfigError, match=r"algo\.gamma"):
        validate(bad)
    cfg.algo.batch_size = 500  # not a multiple of env.num_envs=256: a cross-group rule
    with pytest.raises(ConfigError, match=r"algo\.batch_size=500 .*env\.num_envs=256"):
        validate(cfg)


def test_configs_missing_from_the_package_say_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkout run without `pip install -e .` has no fast_lora_td3.configs: one line says so."""
    import fast_lora_td3.config.compose as compose

    monkeypatch.setattr(compose, "CONFIG_MODULE", "fast_lora_td3.not_installed_configs")
    with pytest.raises(
        ConfigError, match=r"not importable: install the package, `pip install -e \.`"
    ):
        compose_config([])


def test_ppo_skips_the_off_policy_checks() -> None:
    cfg = compose_config(["algo=ppo", "algo.batch_size=7"])
    validate(cfg)  # PPO reads no replay / batch settings


def test_algo_names_are_the_learners_and_ppo() -> None:
    assert set(ALGO_NAMES) == {*LEARNERS, "ppo"}


def test_bad_override_through_the_cli_is_one_line_without_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fast_lora_td3.cli", "train", "algo.gamma=0", "dry_run=true"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "algo.gamma" in lines[0]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algo=fastsac", "algo.std_max=0.2"], "algo.std_max is a FastTD3 setting: algo=fastsac"),
        (["algo=fastsac", "++algo.policy_noise=0.2"], "algo.policy_noise is a FastTD3 setting"),
        (["algo.target_entropy=-3"], "algo.target_entropy is a FastSAC setting: algo=fasttd3"),
    ],
)
def test_a_typed_key_the_algorithm_does_not_read_is_an_error(
    overrides: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fast_lora_td3.cli import main

    assert main(["train", *overrides, "dry_run=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and "or drop it" in err, err


def test_a_presets_fasttd3_keys_are_its_recipe_under_fastsac(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """halfcheetah_cpu sets FastTD3's noise; `algo=fastsac` on top of it is a valid command."""
    from fast_lora_td3.cli import main

    assert main(["train", "experiment=halfcheetah_cpu", "algo=fastsac", "dry_run=true"]) == 0
    assert "algo=fastsac" in capsys.readouterr().out


def test_resume_mutable_keys_name_real_config_fields() -> None:
    keys = flatten_config(dataclasses.asdict(TrainConfig()))
    for pattern in sorted(RESUME_MUTABLE_KEYS):
        assert any(_ignored(key, [pattern]) for key in keys), pattern


def _flat_yaml(path: Path) -> dict[str, object]:
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    return flatten_config(data)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_yaml_keys_differ_from_the_dataclass_defaults(group: str) -> None:
    defaults = flatten_config(dataclasses.asdict(GROUPS[group]()))
    for path in sorted((CONFIGS / group).glob("*.yaml")):
        for key, value in _flat_yaml(path).items():
            assert value != defaults[key], f"{path.name}: {key}: {value!r} is the default"


@pytest.mark.parametrize("path", sorted((CONFIGS / "experiment").glob("*.yaml")), ids=str)
def test_experiment_yaml_keys_differ_from_their_groups(path: Path) -> None:
    """A preset sets only what its groups do not already give; the keys that CPU sizing would
    otherwise change are kept, since a preset that names them pins them (cpu_defaults)."""
    data = yaml.safe_load(path.read_text())
    groups = [
        f"{k.removeprefix('override /')}={v}"
        for item in data.get("defaults", [])
        for k, v in item.items()
    ]
    base = flatten_config(dataclasses.asdict(compose_config(groups)))
    for key, value in _flat_yaml(path).items():
        if key in SIZED_KEYS or key == "experiment":
            continue
        assert value != base[key], f"{path.name}: {key}: {value!r} is what the groups give"


def test_actor_penalty_default_is_fasttd3s_and_presets_keep_theirs() -> None:
    """Unset, `algo.actor_preact_l2` is FastTD3's measured default and off under FastSAC; every
    FastTD3 preset pins 0 (tuned, and the GPU recipes published, without it)."""
    from fast_lora_td3.algos.config import DEFAULT_ACTOR_PREACT_L2

    assert compose_config([]).algo.preact_l2_weight == DEFAULT_ACTOR_PREACT_L2 > 0
    assert compose_config(["algo=fastsac"]).algo.preact_l2_weight == 0.0
    assert compose_config(["algo.actor_preact_l2=0.5"]).algo.preact_l2_weight == 0.5
    validate(compose_config(["algo=fastsac", "algo.actor_preact_l2=0"]))  # 0 is allowed under SAC
    for path in sorted((CONFIGS / "experiment").glob("*.yaml")):
        algo = compose_config([f"experiment={path.stem}"]).algo
        assert algo.preact_l2_weight == 0.0, path.stem
