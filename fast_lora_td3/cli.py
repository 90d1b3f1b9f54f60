"""`fast-lora-td3`: train, play, export, bench, plot.

Hydra-style `key=value` overrides follow the sub-command (`fast-lora-td3 train experiment=cartpole_cpu
seed=2`). Isaac Lab habits are accepted as aliases: `--task`, `--num_envs`, `--seed`, `--device`,
`--headless` (always headless), `--video`, `--resume`. User mistakes print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

EXIT_USER_ERROR = 2
EXIT_NON_FINITE = 1

ALIASES = {
    "--task": "env.task",
    "--num_envs": "env.num_envs",
    "--seed": "seed",
    "--device": "device",
}
FLAG_ALIASES = {
    "--video": "env.video=true",
    "--resume": "resume=true",
    "--verify-compile": "verify_compile=true",
    "--headless": None,
}
SHORT_KEYS = {"task": "env.task", "num_envs": "env.num_envs"}


def translate_overrides(args: Sequence[str]) -> list[str]:
    """Turn Isaac Lab style flags and short keys into Hydra overrides."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key in ALIASES:
            value = value if eq else next(it, "")
            out.append(f"{ALIASES[key]}={value}")
        elif arg in FLAG_ALIASES:
            if FLAG_ALIASES[arg]:
                out.append(FLAG_ALIASES[arg])  # type: ignore[arg-type]
        elif arg.startswith("--"):
            from fast_lora_td3.errors import ConfigError

            raise ConfigError(
                f"unknown option {arg!r}: pass settings as key=value (e.g. env.num_envs=64); "
                f"known flags: {', '.join([*ALIASES, *FLAG_ALIASES])}"
            )
        elif eq and key in SHORT_KEYS:
            out.append(f"{SHORT_KEYS[key]}={value}")
        else:
            out.append(arg)
    return out


def _print_error(exc: BaseException) -> None:
    print(f"fast-lora-td3: error: {exc}", file=sys.stderr, flush=True)


def _cmd_train(overrides: list[str]) -> int:
    from fast_lora_td3.config.compose import compose_config
    from fast_lora_td3.config.cpu_defaults import explicit_keys
    from fast_lora_td3.train import run_training

    return run_training(compose_config(overrides), explicit_keys=explicit_keys(overrides))


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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (sub-commands take Hydra overrides as free arguments)."""
    parser = argparse.ArgumentParser(
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
    ns = build_parser().parse_args(argv)
    handler = COMMANDS[ns.command][0]
    try:
        overrides = ns.overrides if ns.command == "bench" else translate_overrides(ns.overrides)
        return handler(overrides)
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
