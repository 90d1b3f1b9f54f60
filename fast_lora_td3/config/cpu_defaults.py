"""CPU-sized defaults: batch, network widths, updates per step, FastTD3's actor learning rate (and
mjlab's env count) on a CPU.

The built-in defaults are FastTD3's GPU recipe (batch 32768, critic 1024-512-256, 4 updates per
step, 4096 mjlab envs). On a CPU one such update costs seconds, so a run that sets only the task
trains for minutes without writing a metrics line (issue 9). When `device` resolves to `cpu` and
`cpu_defaults=true` (the default), every one of the keys below that the user did not set is sized
for a CPU, and one line says what was chosen and how to override it.

What "set" means. Hydra merges the dataclass defaults, the group files (`critic=simbav2` →
configs/critic/simbav2.yaml, which repeats GPU recipe values) and the preset, so comparing values
with the dataclass defaults cannot tell `algo.batch_size=32768` typed by the user from the default.
Instead the keys are tracked where they come from: a key counts as set when a command-line override
names it (`algo.batch_size=…`, `+…`, `++…`, aliases such as `--num_envs` after translation) or when
the chosen preset (`experiment=<name>`) sets it. Group files are recipes, not choices: `critic=simbav2`
alone still gets a CPU width. `cpu_defaults=false` keeps every value as composed.

Cost table (measured on the 2-core development machine, one torch thread, machine shared with three
other jobs; `fast-lora-td3 bench update obs_dim=17 action_dim=6 num_atoms=101 n_step=1 threads=1`,
eager; env steps from gymnasium `make_vec(…, "sync")` and mjlab on CPU with random actions):

    one critic update (with its share of actor update, Polyak, sampling)     ms
      mlp 1024-512-256 / actor 512-256-128, batch 32768 (GPU recipe)       9500
      mlp 256-256 / actor 256-256, batch 256                                 14
      mlp 256-256 / actor 256-256, batch 512                                 25
      simbav2 width 128 × 1 block / actor 256-256, batch 256                 22
      simbav2 width 256 × 2 blocks / actor 256-256, batch 256               102
    one env step, per env                                                    ms
      gymnasium HalfCheetah-v5 (8 envs)      0.06     Hopper-v5            0.14
      mjlab G1 flat (16 / 64 / 256 envs)     6.5 / 3.3 / 3.8
      mjlab Go1 flat (32 / 64 / 128 envs)    11 / 8 / 6

Re-measured 2026-12-06 on an idle 2-core machine (0.77× the speed of the one above by SB3 TD3's
env steps; pinned, one thread; `… threads=1 num_envs=16 rounds=5 iters=20 actor.hidden_dims=[256,256]`
with the critic flags below; FastTD3 with its actor penalty; medians of 5 alternating rounds):

    one critic update                                                        ms
      mlp 256-256, batch 256 / 512 / 1024                      11-15 / 20 / 38
      mlp_lora 256-256 rank 16, batch 256                 0.97× its dense twin
      simbav2 width 128 × 1 block, batch 256                                 19
      simbav2_lora width 128 × 1 block, batch 256         26 (1.22× dense, 21)
      simbav2 width 256 × 2 blocks, batch 256                                92
    one 16-env gymnasium step (`make_vec(…, "sync")`, random actions), per env   ms
      HalfCheetah-v5 0.050   Hopper-v5 0.112   Ant-v5 0.258   Humanoid-v5 0.260

The tabled constants below still give the same choices (1 update per gymnasium vector step,
the recipe's 4 for mjlab's 16 envs): an update still costs 3-20 vector steps of 16 gymnasium envs.

Choice. The smallest sizes that still learn the MuJoCo tasks in the literature (SB3 zoo TD3 uses
400-300 at batch 256): critic mlp 256-256 or SimbaV2 width 128 × 1 block, actor 256-256 (SimbaV2
actor 128 × 1), batch 256 (rounded up to a multiple of num_envs). Updates per iteration: as many as
fit in the time of one vector env step (`UPDATE_TIME_RATIO`), at least 1 and at most the recipe's
value, using the tabled costs: 8 gymnasium envs step in ~1 ms, so they get 1 update per iteration
(an update then costs ~15 env steps, the cheapest that learns); 16 mjlab G1 envs step in ~100 ms, so
they keep the recipe's 4. mjlab's 4096 envs step in ~14 s on a CPU; `env.num_envs` becomes
`CPU_MJLAB_NUM_ENVS` so that an episode ends (and is logged) within seconds. FastTD3's actor learning
rate goes with the CPU batch: `CPU_TD3_ACTOR_LR` where the batch is sized too (chosen on the untuned
suite); a batch set by the user or the preset keeps the recipe's rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fast_lora_td3.config.schema import TrainConfig

CPU_BATCH_SIZE = 256
"""Target batch on CPU (rounded up to a multiple of env.num_envs)."""
CPU_CRITIC_HIDDEN = [256, 256]
"""`mlp` / `mlp_lora` critic widths on CPU."""
CPU_ACTOR_HIDDEN = [256, 256]
"""`mlp` actor widths on CPU."""
CPU_SIMBA_WIDTH, CPU_SIMBA_BLOCKS = 128, 1
"""`simbav2` / `simbav2_lora` critic (and simbav2 actor) size on CPU."""
CPU_TD3_ACTOR_LR = 1e-4
"""FastTD3's actor learning rate at the CPU batch. The recipe's 3e-4 goes with batch 32768; at 256 the
actor's steps are noisier, and on the untuned suite 1e-4 kept Hopper hopping where 3e-4 broke down
(docs/RESULTS.md, untuned). FastSAC keeps its recipe's rate."""
CPU_MJLAB_NUM_ENVS = 16
"""mjlab envs on CPU: ~0.1 s per vector step for the G1, so a fallen robot's episode ends in seconds."""
UPDATE_MS = {"mlp": 14.0, "mlp_lora": 16.0, "simbav2": 22.0, "simbav2_lora": 25.0}
"""Tabled ms per critic update at the CPU sizes above (LoRA: the measured dense cost + ~15 %)."""
ENV_STEP_MS_PER_ENV = {"gymnasium": 0.1, "mjlab": 4.0, "dummy": 0.01, "isaaclab": 1.0}
"""Tabled ms per env step per env on CPU (see the module docstring)."""
UPDATE_TIME_RATIO = 1.0
"""Updates per iteration may take at most this multiple of the vector env step's time."""

SIZED_KEYS = (
    "env.num_envs",
    "algo.batch_size",
    "algo.num_updates",
    "algo.actor_lr",
    "critic.hidden_dims",
    "critic.width",
    "critic.num_blocks",
    "actor.hidden_dims",
    "actor.width",
    "actor.num_blocks",
)
"""The keys this module may size (each only when not set by the user or the preset)."""


def _flatten(node: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{dotted}.")
        else:
            yield dotted


def preset_keys(name: str) -> set[str]:
    """Dotted keys that configs/experiment/<name>.yaml sets (its `defaults` list excluded)."""
    import yaml

    import fast_lora_td3.configs as configs

    path = Path(configs.__file__).parent / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return set()  # Hydra reports the unknown preset itself
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    return set(_flatten(data))


def explicit_keys(overrides: Sequence[str]) -> set[str]:
    """Keys set by command-line overrides (already translated to Hydra form) or by the preset."""
    keys: set[str] = set()
    for word in overrides:
        key, eq, value = word.partition("=")
        if not eq or key.startswith("~"):
            continue
        key = key.lstrip("+")
        keys.add(key)
        if key == "experiment":
            keys |= preset_keys(value)
    return keys


def _family_keys(cfg: TrainConfig, explicit: set[str]) -> list[str]:
    """The sized keys the chosen families actually use."""
    keys = ["algo.batch_size", "algo.num_updates"]
    # FastTD3's CPU actor lr goes with the CPU batch: a batch set by hand keeps the recipe's lr.
    if cfg.algo.name == "fasttd3" and "algo.batch_size" not in explicit:
        keys.append("algo.actor_lr")
    if cfg.env.backend == "mjlab":
        keys.insert(0, "env.num_envs")
    if cfg.critic.family in ("mlp", "mlp_lora"):
        keys.append("critic.hidden_dims")
    else:
        keys += ["critic.width", "critic.num_blocks"]
    if cfg.actor.family == "mlp":
        keys.append("actor.hidden_dims")
    else:
        keys += ["actor.width", "actor.num_blocks"]
    return keys


def cpu_num_updates(cfg: TrainConfig) -> int:
    """Updates per iteration that fit in one vector env step (tabled costs), in [1, recipe value]."""
    env_ms = ENV_STEP_MS_PER_ENV.get(cfg.env.backend, 1.0) * cfg.env.num_envs
    update_ms = UPDATE_MS.get(cfg.critic.family, 20.0)
    fit = math.floor(UPDATE_TIME_RATIO * env_ms / update_ms)
    return max(1, min(cfg.algo.num_updates, fit))


def apply_cpu_defaults(cfg: TrainConfig, explicit: set[str]) -> str | None:
    """Size the unset keys of `cfg` for a CPU in place; returns the one-line note (None: unchanged).

    Call only when the device resolved to `cpu`; PPO (algo=ppo) and `cpu_defaults=false` are left
    alone.
    """
    if not cfg.cpu_defaults or cfg.algo.name == "ppo":
        return None
    chosen: dict[str, Any] = {}
    for key in _family_keys(cfg, explicit):
        if key in explicit:
            continue
        if key == "env.num_envs":
            cfg.env.num_envs = min(cfg.env.num_envs, CPU_MJLAB_NUM_ENVS)
            value: Any = cfg.env.num_envs
        elif key == "algo.batch_size":
            n = cfg.env.num_envs
            value = cfg.algo.batch_size = max(1, math.ceil(CPU_BATCH_SIZE / n)) * n
        elif key == "algo.num_updates":
            continue  # after the sizes and env count are known (below)
        elif key == "algo.actor_lr":
            value = cfg.algo.actor_lr = CPU_TD3_ACTOR_LR
        elif key == "critic.hidden_dims":
            value = cfg.critic.hidden_dims = list(CPU_CRITIC_HIDDEN)
        elif key == "critic.width":
            value = cfg.critic.width = CPU_SIMBA_WIDTH
        elif key == "critic.num_blocks":
            value = cfg.critic.num_blocks = CPU_SIMBA_BLOCKS
        elif key == "actor.hidden_dims":
            value = cfg.actor.hidden_dims = list(CPU_ACTOR_HIDDEN)
        elif key == "actor.width":
            value = cfg.actor.width = CPU_SIMBA_WIDTH
        else:  # actor.num_blocks
            value = cfg.actor.num_blocks = CPU_SIMBA_BLOCKS
        chosen[key] = value
    if "algo.num_updates" not in explicit:
        chosen["algo.num_updates"] = cfg.algo.num_updates = cpu_num_updates(cfg)
    if not chosen:
        return None
    text = " ".join(
        f"{k}={'[' + ','.join(map(str, v)) + ']' if isinstance(v, list) else v}"
        for k, v in chosen.items()
    )
    return (
        f"cpu defaults: {text} (the GPU recipe's sizes are too slow on a CPU; set any of these "
        "keys to override, or cpu_defaults=false to keep the recipe)"
    )
