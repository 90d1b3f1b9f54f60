#!/usr/bin/env python
"""Thin wrapper of `fast-lora-td3 bench replay key=value…` (same code, same JSON lines).

Example: python scripts/bench_replay.py obs_dim=123 action_dim=37 num_envs=1024 buffer_size=1024
"""

from __future__ import annotations

import sys

from fast_lora_td3.bench import run_bench
from fast_lora_td3.errors import ConfigError

if __name__ == "__main__":
    try:
        sys.exit(run_bench(["replay", *sys.argv[1:]]))
    except ConfigError as exc:
        print(f"bench_replay: error: {exc}", file=sys.stderr)
        sys.exit(2)
