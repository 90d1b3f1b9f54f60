#!/usr/bin/env python
"""Thin wrapper of `fast-lora-td3 bench update key=value…` (same code, same JSON lines).

Example: python scripts/bench_update.py critic=simbav2_lora batch_size=8192 modes=eager,compiled
"""

from __future__ import annotations

import sys

from fast_lora_td3.bench import run_bench
from fast_lora_td3.errors import ConfigError

if __name__ == "__main__":
    try:
        sys.exit(run_bench(["update", *sys.argv[1:]]))
    except ConfigError as exc:
        print(f"bench_update: error: {exc}", file=sys.stderr)
        sys.exit(2)
