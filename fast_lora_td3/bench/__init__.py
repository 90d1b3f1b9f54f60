"""`fast-lora-td3 bench update|replay key=value…`: throughput benchmarks, one JSON line per result.

`bench update` (bench/update.py) times critic updates with everything the recipe runs around them,
counts their GEMM FLOPs and compares the rates with GEMM meters; `rounds=N` alternates every timed
configuration so ratios such as `lora_overhead` hold on a shared, loaded machine. `bench replay`
(bench/replay.py) reports bytes per transition against a buffer that stores next_obs explicitly,
and the samples/s of `sample_nstep`. Settings use the training schema (bench/config.py);
`bench learn` (the learning suite) lives in fast_lora_td3/bench/learn.py.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from fast_lora_td3.bench.config import (
    MODES,
    ReplayBenchConfig,
    UpdateBenchConfig,
    flat_defaults,
    parse_bench_config,
)
from fast_lora_td3.bench.meters import count_update_flops, filled_replay, gemm_gflops
from fast_lora_td3.bench.replay import bench_replay
from fast_lora_td3.bench.update import bench_update, implementation, time_update
from fast_lora_td3.errors import ConfigError

__all__ = [
    "MODES",
    "bench_replay",
    "bench_update",
    "count_update_flops",
    "filled_replay",
    "gemm_gflops",
    "implementation",
    "run_bench",
    "time_update",
]

_SCHEMAS = {"update": UpdateBenchConfig, "replay": ReplayBenchConfig}


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _keys_line(schema: type) -> str:
    return " ".join(f"{k}={v}" for k, v in flat_defaults(schema).items())


def run_bench(args: list[str]) -> int:
    """Entry point of `fast-lora-td3 bench`: `update key=value…` or `replay key=value…`."""
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nupdate keys: {_keys_line(UpdateBenchConfig)}")
        print(f"modes: {', '.join(MODES)}")
        print(f"replay keys: {_keys_line(ReplayBenchConfig)}")
        return 0 if args else 2
    what, rest = args[0], args[1:]
    if what not in _SCHEMAS:
        raise ConfigError(
            f"bench: unknown benchmark {what!r}: use `bench update` or `bench replay`"
        )
    cfg, given = parse_bench_config(rest, _SCHEMAS[what])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if what == "update":
        bench_update(cfg, _emit, given)  # type: ignore[arg-type]
    else:
        _emit(bench_replay(cfg))  # type: ignore[arg-type]
    sys.stdout.flush()
    return 0
