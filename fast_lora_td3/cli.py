"""`fast-lora-td3`: train, play, export, bench, plot.

Hydra-style `key=value` overrides follow the sub-command (`fast-lora-td3 train experiment=cartpole_cpu
seed=2`). Isaac Lab habits are accepted as aliases in any position (`ALIASES`, `FLAG_ALIASES`);
`--help` lists every key from the config docstrings; `--cfg job` prints the composed config. User
mistakes print one line and exit 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import sys
import textwrap
import traceback
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, NoReturn

EXIT_USER_ERROR = 2
EXIT_NON_FINITE = 1

ALIASES = {
    "--task": "env.task",
    "--num_envs": "env.num_envs",
    "--seed": "seed",
    "--device": "device",
    "--checkpoint": "checkpoint",
}
FLAG_ALIASES = {
    "--video": "env.video=true",
    "--resume": "resume=true",
    "--verify-compile": "verify_compile=true",
    "--headless": None,
}
SHORT_KEYS = {"task": "env.task", "num_envs": "env.num_envs"}
HELP_FLAGS = ("-h", "--help")
CFG_FLAGS = ("--cfg", "-c")
"""Hydra's `--cfg job`: print the composed config and exit (only `job`: there is no Hydra app)."""
TRAIN_ONLY = ("--resume", "--verify-compile")
"""Flags that mean nothing to play / export (their help leaves them out)."""
PLAY_NUM_ENVS = "Envs play runs (--num_envs N); not set: the run's eval.num_envs."
HYDRA_COMMANDS = ("train", "play", "export")
"""Sub-commands whose arguments are Hydra overrides and Isaac Lab flags, in any order."""


class CommandLine(NamedTuple):
    """A train / play / export command line: Hydra overrides, `--help`, `--cfg job`."""

    overrides: list[str]
    help: bool = False
    cfg: str | None = None


def _flag_value(flag: str, eq: str, value: str, rest: Iterator[str]) -> str:
    """The value of `--flag=V` or `--flag V`; a missing one is a ConfigError."""
    from fast_lora_td3.errors import ConfigError

    value = value if eq else next(rest, "")
    if not value or value.startswith("--"):
        raise ConfigError(f"{flag} needs a value: {flag} VALUE or {flag}=VALUE")
    return value


def parse_command_line(args: Sequence[str]) -> CommandLine:
    """Isaac Lab flags (`--task X`, `--task=X`, `--headless` …), `--help` and `--cfg job` in any
    position among Hydra `key=value` overrides; the flags become overrides."""
    from fast_lora_td3.errors import ConfigError

    out: list[str] = []
    show_help, cfg = False, None
    it = iter(args)
    for arg in it:
        key, eq, value = arg.partition("=")
        if arg in HELP_FLAGS:
            show_help = True
        elif key in CFG_FLAGS:
            cfg = _flag_value(key, eq, value, it)
            if cfg != "job":
                raise ConfigError(
                    f"{key}={cfg!r} is not valid: use --cfg job (no Hydra app config)"
                )
        elif key in ALIASES:
            out.append(f"{ALIASES[key]}={_flag_value(key, eq, value, it)}")
        elif arg in FLAG_ALIASES:
            if FLAG_ALIASES[arg]:
                out.append(FLAG_ALIASES[arg])  # type: ignore[arg-type]
        elif arg.startswith("-"):
            raise ConfigError(
                f"unknown option {arg!r}: pass settings as key=value (e.g. env.num_envs=64); "
                f"known flags: {', '.join([*ALIASES, *FLAG_ALIASES, *HELP_FLAGS, '--cfg job'])}"
            )
        elif eq and key in SHORT_KEYS:
            out.append(f"{SHORT_KEYS[key]}={value}")
        else:
            out.append(arg)
    return CommandLine(out, show_help, cfg)


def translate_overrides(args: Sequence[str]) -> list[str]:
    """Turn Isaac Lab style flags and short keys into Hydra overrides."""
    return parse_command_line(args).overrides


def _print_error(exc: BaseException) -> None:
    print(f"fast-lora-td3: error: {exc}", file=sys.stderr, flush=True)


def _cmd_train(overrides: list[str]) -> int:
    from fast_lora_td3.config.compose import compose_config
    from fast_lora_td3.config.cpu_defaults import explicit_keys
    from fast_lora_td3.config.validate import check_typed_algo_keys
    from fast_lora_td3.train import resumes, run_training

    cfg = compose_config(overrides)
    # A resume takes its algorithm from the saved run (train.reuse_saved_config): not checked.
    if not resumes(cfg):
        typed = [o for o in overrides if not o.lstrip("+").startswith("experiment=")]
        check_typed_algo_keys(cfg.algo.name, explicit_keys(typed))
    return run_training(cfg, explicit_keys=explicit_keys(overrides))


def _cmd_play(overrides: list[str]) -> int:
    from fast_lora_td3.deploy.play import run_play

    return run_play(overrides)


def _cmd_export(overrides: list[str]) -> int:
    from fast_lora_td3.deploy.export import run_export

    return run_export(overrides)


def _cmd_bench(overrides: list[str]) -> int:
    if overrides and overrides[0] == "learn":
        from fast_lora_td3.bench.learn import run_bench_learn

        return run_bench_learn(overrides[1:])
    from fast_lora_td3.bench import run_bench

    return run_bench(overrides)


def _cmd_plot(args: list[str]) -> int:
    from fast_lora_td3.runs.plot import plot_runs

    parser = argparse.ArgumentParser(prog="fast-lora-td3 plot")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("curves.png"))
    ns = parser.parse_args(args)
    plot_runs(ns.run_dirs, ns.out)
    print(f"wrote {ns.out}")
    return 0


COMMANDS = {
    "train": (_cmd_train, "train FastTD3 / FastSAC (or the rsl_rl PPO baseline with algo=ppo)"),
    "play": (_cmd_play, "run deterministic episodes of a checkpoint (checkpoint=PATH), video=true"),
    "export": (_cmd_export, "export a checkpoint's policy (ONNX, TorchScript, policy.json)"),
    "bench": (
        _cmd_bench,
        "benchmarks: `bench update|replay key=value…`; `bench learn SUITE` (learning suite)",
    ),
    "plot": (_cmd_plot, "plot return / critic-loss curves of run directories: plot RUN… --out F"),
}


def _print_config(command: str, overrides: list[str]) -> int:
    """Hydra's `--cfg job`: the composed config as YAML; builds and writes nothing."""
    from omegaconf import OmegaConf

    from fast_lora_td3.config.compose import compose_config
    from fast_lora_td3.errors import ConfigError

    if command != "train":
        raise ConfigError(
            f"--cfg job is a train option: {command} uses the run's saved config.yaml"
        )
    print(OmegaConf.to_yaml(OmegaConf.structured(compose_config(overrides))), end="")
    return 0


def field_docs(cls: type) -> dict[str, str]:
    """Field name → its docstring (the string literal under the field in the class body), on one
    line; the config dataclasses document every field this way."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, doc in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            docs[node.target.id] = " ".join(doc.value.value.split())
    return docs


def _default_text(f: dataclasses.Field) -> str:
    """A field's default as it is written on the command line."""
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value) if value != "" else "''"


def _group_options(group: str) -> list[str]:
    """The YAML options of a config group (`algo=fastsac`), from the shipped configs."""
    from importlib.resources import files

    from fast_lora_td3.config.compose import CONFIG_MODULE

    folder = files(CONFIG_MODULE) / group
    if not folder.is_dir():
        return []
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def config_keys(cls: type, prefix: str = "", only: Sequence[str] = ()) -> list[tuple[str, str]]:
    """`(key=default, description)` for every field of the dataclass `cls`, nested groups after the
    plain keys and walked the same way (`only`: these top-level fields only)."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    rows, groups = [], []
    for f in dataclasses.fields(cls):
        if only and f.name not in only:
            continue
        key, doc = prefix + f.name, docs.get(f.name, "")
        if dataclasses.is_dataclass(hints[f.name]):
            options = _group_options(key) if not prefix else []
            rows.append((f"{key}=" + "|".join(options) if options else f"{key}.*", doc))
            groups.append((hints[f.name], key + "."))
            continue
        if key == "experiment":
            doc += " Presets: " + ", ".join(_group_options(key)) + "."
        rows.append((f"{key}={_default_text(f)}", doc))
    for group, group_prefix in groups:
        rows += config_keys(group, group_prefix)
    return rows


def _format_rows(title: str, rows: list[tuple[str, str]]) -> str:
    """One line per key: the key and default, then its description."""
    width = min(max(len(k) for k, _ in rows), 36)
    return "\n".join([title, *(f"  {k:<{width}}  {d}" for k, d in rows)])


def command_help(command: str) -> str:
    """`train|play|export --help`: usage, flags, and one line per key, generated from the
    docstrings of the config dataclasses (and of play's / export's own keys)."""
    from fast_lora_td3.config.schema import TrainConfig

    skip = {"train": (), "play": TRAIN_ONLY, "export": (*TRAIN_ONLY, "--video")}[command]
    flags = [(f"{k} VALUE", f"{v}=VALUE") for k, v in ALIASES.items() if k not in skip]
    flags += [
        (k, v or "ignored: always headless") for k, v in FLAG_ALIASES.items() if k not in skip
    ]
    if command == "train":
        flags.append(("--cfg job", "print the composed config as YAML and exit"))
    flags.append(("-h, --help", "this list"))
    parts = [
        f"usage: fast-lora-td3 {command} [key=value | --flag ...]  (any order)",
        "",
        COMMANDS[command][1],
        "",
        _format_rows("Isaac Lab flags (--flag VALUE or --flag=VALUE, in any position):", flags),
        "",
    ]
    if command == "train":
        parts.append(_format_rows("Keys (key=default):", config_keys(TrainConfig)))
        return "\n".join(parts)
    from fast_lora_td3.deploy.export import ExportArgs
    from fast_lora_td3.deploy.play import PlayArgs

    own = PlayArgs if command == "play" else ExportArgs
    used = ("seed", "device", "env", "eval") if command == "play" else ("device", "env")
    parts.append(_format_rows(f"{command} keys:", config_keys(own)))
    parts.append("")
    title = (
        "Config keys it reads, over the run's saved config.yaml (defaults shown are a new run's; "
        "every key of `train --help` is accepted):"
    )
    rows = config_keys(TrainConfig, only=used)
    if command == "play":  # play's own reading of env.num_envs (see deploy/play.py)
        rows = [(k, PLAY_NUM_ENVS if k.startswith("env.num_envs=") else d) for k, d in rows]
    parts.append(_format_rows(title, rows))
    return "\n".join(parts)


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as the project's one line (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        _print_error(ValueError(f"{message} (see fast-lora-td3 --help)"))
        sys.exit(EXIT_USER_ERROR)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (sub-commands take Hydra overrides as free arguments)."""
    parser = _OneLineParser(
        prog="fast-lora-td3",
        description="FastTD3 / FastSAC with SimbaV2-LoRA critics. Overrides: key=value (Hydra).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, add_help=name != "plot")
        p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value overrides")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code.

    After Isaac Lab started its Kit app, every error is printed first and the app is closed as the
    very last act, ending the process with the exit code (``finish_simulation_app``)."""
    try:
        code = _main(argv)
    except BaseException:
        if _isaac_app() is None:
            raise
        traceback.print_exc()
        code = 1
    isaac = _isaac_app()
    return code if isaac is None else isaac.finish_simulation_app(code)


def _isaac_app() -> ModuleType | None:
    """The Isaac Lab adapter module if it started a Kit app in this process (never imports it)."""
    module = sys.modules.get("fast_lora_td3.envs.isaaclab_env")
    return module if module is not None and module._APP is not None else None


def _main(argv: Sequence[str] | None) -> int:
    from fast_lora_td3.errors import ConfigError, NonFiniteError

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plot":
        try:
            return _cmd_plot(argv[1:])
        except ConfigError as exc:
            _print_error(exc)
            return EXIT_USER_ERROR
    if argv and argv[0] in HYDRA_COMMANDS:  # argparse would stop at a flag before a key=value
        command, args = argv[0], argv[1:]
    else:
        ns = build_parser().parse_args(argv)
        command, args = ns.command, ns.overrides
    handler = COMMANDS[command][0]
    try:
        if command == "bench":
            return handler(args)
        line = parse_command_line(args)
        if line.help:
            print(command_help(command))
            return 0
        if line.cfg:
            return _print_config(command, line.overrides)
        return handler(line.overrides)
    except ConfigError as exc:
        _print_error(exc)
        return EXIT_USER_ERROR
    except NonFiniteError as exc:
        _print_error(exc)
        return EXIT_NON_FINITE
    except KeyboardInterrupt:
        _print_error(KeyboardInterrupt("interrupted"))
        return 130


if __name__ == "__main__":
    sys.exit(main())
