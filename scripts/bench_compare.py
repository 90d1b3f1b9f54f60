#!/usr/bin/env python
"""Old code vs new code, `bench update` in alternating rounds (a shared machine drifts: compare
only what ran in the same stretch of time).

Each round runs `fast-lora-td3 bench update <args>` once per source tree, as a subprocess with
PYTHONPATH set to that tree, in the order old, new (odd rounds) or new, old (even rounds). Prints
one JSON line per (round, tree, record) and a summary line per critic: the median over rounds of
the per-round `updates_per_s` ratio new/old, and each side's median `gemm_fraction` and
`lora_overhead`.

Example (the old tree from `git worktree add /tmp/old <commit>`):
    python scripts/bench_compare.py --old /tmp/old --rounds 3 -- critic=simbav2_lora batch_size=1024
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_RUN = "import sys; from fast_lora_td3.bench import run_bench; sys.exit(run_bench(sys.argv[1:]))"


def run_tree(tree: Path, args: list[str], threads: int) -> list[dict[str, Any]]:
    """One `bench update` in a subprocess that imports fast_lora_td3 from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-c", _RUN, "update", *args]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    """Parse flags, alternate the trees for `--rounds` rounds, print JSON lines and summaries."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="source tree of the old code")
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both sides")
    ap.add_argument("bench_args", nargs="*", help="key=value arguments of `bench update`")
    ns = ap.parse_args(argv)
    trees = {"old": ns.old.resolve(), "new": ns.new.resolve()}
    # speed[(tree, critic)] = per-round updates/s; also each side's reported fractions
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(ns.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for side in order:
            start = time.time()
            for rec in run_tree(trees[side], ns.bench_args, ns.threads):
                if "updates_per_s" not in rec:
                    continue
                rec = {"round": r, "tree": side, "load1": os.getloadavg()[0], **rec}
                rec["wall_s"] = time.time() - start
                print(json.dumps(rec), flush=True)
                seen.setdefault((side, rec["critic"]), []).append(rec)
    for critic in sorted({c for _, c in seen}):
        old, new = seen.get(("old", critic), []), seen.get(("new", critic), [])
        if not old or not new:
            continue
        ratios = [n["updates_per_s"] / o["updates_per_s"] for o, n in zip(old, new, strict=True)]
        summary: dict[str, Any] = {
            "summary": critic,
            "speedup_new_over_old": statistics.median(ratios),
            "speedup_rounds": ratios,
        }
        for side, recs in (("old", old), ("new", new)):
            for key in ("updates_per_s", "gemm_fraction", "lora_overhead"):
                values = [x[key] for x in recs if key in x]
                if values:
                    summary[f"{side}_{key}"] = statistics.median(values)
        summary["load1_during"] = [x["load1"] for x in old + new]
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
