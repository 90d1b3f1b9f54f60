"""`fast-lora-td3 bench learn SUITE [out=DIR] [workers=N] [seeds=1,2,3] [only=TASK,…]
[methods=METHOD,…] [merge=RESULTS_JSON]` and `fast-lora-td3 bench learn report RESULTS_JSON… [page=FILE]`.

Runs a named suite of (task preset × method × seed) training runs, each as its own process on the
same machine, then aggregates them with fast_lora_td3.bench.stats (mean and 95 % bootstrap CI of
the final and area-under-curve return, of the return at fixed env-step checkpoints, time to a
return threshold, critic loss, weight change from init, adapter norms) and writes into DIR:
`results.json` (the numbers, each run's curves shrunk to ≤ 100 points, the suite, command and
commit), `results.md` (Markdown tables: headline, LoRA vs dense, full tables) and the plots
(`curves_env_steps.png`, `curves_wall_clock.png`, … : one panel per task, CI bands).

`report` redraws results.md and the plots next to a results.json from that file alone (no run
directories), and with `page=FILE` rewrites the suite's tables that FILE quotes between
`<!-- BEGIN GENERATED: SUITE BLOCK -->` / `<!-- END GENERATED -->` lines. A results page is
updated by committing DIR/results.json as docs/results/SUITE/results.json and running
`fast-lora-td3 bench learn report docs/results/SUITE/results.json page=docs/RESULTS.md`.

Methods: a critic family (`mlp`, `mlp_lora`, `simbav2`, `simbav2_lora`: our FastTD3 with that
critic at the preset's sizes), `ppo` (the rsl_rl baseline, `algo=ppo`, mjlab tasks) and `sb3_td3` /
`sb3_sac` (Stable-Baselines3 with rl-baselines3-zoo MuJoCo settings, gymnasium tasks; the `bench`
extra). Every method gets the task's env-step budget. A run whose directory holds `bench_done.json`
is not run again, so an interrupted suite continues where it stopped (ours also resume from their
checkpoints). Runs are single-threaded (OMP_NUM_THREADS=1); `workers` runs that many at once.

`merge=RESULTS_JSON` carries the finished runs of an earlier results.json of the same suite (a
committed docs/results/SUITE/results.json) into this one and does not rerun them, so a suite longer
than one machine's session grows over sessions. Each run records the commit that executed it.
`methods=METHOD,…` runs only those methods; with `merge=` their runs in the earlier file of the
tasks and seeds this invocation runs (`only=`, `seeds=`) are replaced by this suite's (a method
whose default changed is rerun, the other methods, tasks and seeds are carried).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fast_lora_td3.bench import stats as bench_stats
from fast_lora_td3.bench.plots import run_curves
from fast_lora_td3.bench.suites import LORA_PAIRS, SUITES, Suite, TaskSpec
from fast_lora_td3.errors import ConfigError

DONE_FILE = "bench_done.json"


@dataclass
class RunSpec:
    """One process of the suite."""

    task: str
    method: str
    seed: int
    run_dir: Path
    command: list[str] = field(default_factory=list)


def _method_override(method: str) -> str:
    """The override that selects a method of ours: `default` adds none (the untuned defaults)."""
    if method == "default":
        return ""
    if method == "ppo":
        return "algo=ppo"
    if method == "fastsac":
        return "algo=fastsac"
    return f"critic={method}"


def task_methods(suite: Suite, task: TaskSpec) -> tuple[str, ...]:
    """The critic families and peers run on `task`."""
    return (*(suite.critics if task.critics is None else task.critics), *task.peers)


def only_methods(suite: Suite, keep: set[str]) -> Suite:
    """`suite` with only the methods in `keep` (critic families, `fastsac`, peers) on each task."""
    known = {m for t in suite.tasks for m in task_methods(suite, t)}
    if keep - known:
        raise ConfigError(
            f"bench learn: methods={','.join(sorted(keep - known))} not in the {suite.name} "
            f"suite: use some of {','.join(sorted(known))}"
        )

    def kept(task: TaskSpec) -> TaskSpec:
        critics = suite.critics if task.critics is None else task.critics
        peers = tuple(p for p in task.peers if p in keep)
        return replace(task, critics=tuple(c for c in critics if c in keep), peers=peers)

    return replace(suite, tasks=tuple(kept(t) for t in suite.tasks))


def task_seeds(suite: Suite, task: TaskSpec) -> tuple[int, ...]:
    """The seeds of `task`."""
    return suite.seeds if task.seeds is None else task.seeds


def plan_runs(suite: Suite, out: Path) -> list[RunSpec]:
    """Every (task, method, seed) of the suite with its command and run directory."""
    runs = []
    py = [sys.executable, "-m"]
    for task in suite.tasks:
        for method in task_methods(suite, task):
            for seed in task_seeds(suite, task):
                run_dir = out / "runs" / task.key / method / f"seed{seed}"
                if method.startswith("sb3_"):
                    cmd = [*py, "fast_lora_td3.bench.peers", method, task.gym_id, str(seed)]
                    cmd += [str(task.total_steps), str(run_dir)]
                    if task.peer_learning_starts is not None:
                        cmd.append(f"learning_starts={task.peer_learning_starts}")
                    if task.wall_s:
                        cmd.append(f"max_wall_s={task.wall_s:g}")
                else:
                    cmd = [*py, "fast_lora_td3.cli", "train"]
                    cmd += [f"experiment={task.preset}"] if task.preset else []
                    cmd += [_method_override(method)] if _method_override(method) else []
                    cmd += [f"seed={seed}", f"total_steps={task.total_steps}", "device=cpu"]
                    cmd += [f"run_dir={run_dir}", "progress=false", "export_at_end=false"]
                    cmd += [f"max_wall_s={task.wall_s:g}"] if task.wall_s else []
                    cmd += list(task.overrides)
                runs.append(RunSpec(task.key, method, seed, run_dir, cmd))
    return runs


def execute(run: RunSpec, core: int | None = None) -> dict[str, Any]:
    """Run one process (unless already done) pinned to `core` when given; its output goes to
    run_dir/output.log."""
    done = run.run_dir / DONE_FILE
    if done.exists():
        return json.loads(done.read_text())
    run.run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    commit = _commit()  # the code the run starts from, not HEAD when it ends
    t0 = time.perf_counter()
    with (run.run_dir / "output.log").open("w") as log:
        pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
        rc = subprocess.call(
            run.command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=pin
        )
    record = {"rc": rc, "process_s": time.perf_counter() - t0, "command": run.command}
    record["commit"] = commit
    if core is not None:
        record["core"] = core
    if rc == 0:
        done.write_text(json.dumps(record))
    return record


WARMUP_OVERRIDES = ("total_steps=2000", "max_wall_s=20")
"""A warm-up run's budget: long enough to launch every simulator kernel once."""


def warm_simulators(suite: Suite, runs: list[RunSpec], out: Path) -> None:
    """Before the timed runs, run each pending mjlab task of ours once, briefly and untimed, so that
    MuJoCo Warp compiles its kernels into ~/.cache/warp outside every timed run (~40 s on a CPU
    the first time on a machine; seconds once cached)."""
    from fast_lora_td3.config.compose import compose_config

    timed = {t.key for t in suite.tasks if t.wall_s}
    first: dict[str, RunSpec] = {}  # each task's first run of ours: its command is the warm-up's
    for run in runs:
        if run.task in timed and not run.method.startswith("sb3_"):
            first.setdefault(run.task, run)
    for task, run in first.items():
        if compose_config(run.command[run.command.index("train") + 1 :]).env.backend != "mjlab":
            continue
        drop = ("run_dir=", "total_steps=", "max_wall_s=")  # the warm-up sets its own
        cmd = [a for a in run.command if not a.startswith(drop)]
        cmd += [f"run_dir={out / 'warmup' / task}", *WARMUP_OVERRIDES]
        shutil.rmtree(out / "warmup" / task, ignore_errors=True)  # a fresh run, not a resume
        (out / "warmup").mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with (out / "warmup" / f"{task}.log").open("w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        status = "ok" if rc == 0 else f"FAILED rc={rc} (see warmup/{task}.log)"
        print(
            f"  {task} simulator warm-up ({time.perf_counter() - t0:.0f} s): {status}", flush=True
        )


RunKey = tuple[str, str, int]
"""(task, method, seed): a run's identity across results files."""


def run_suite(
    suite: Suite, out: Path, workers: int | None = None, skip: frozenset[RunKey] = frozenset()
) -> list[dict[str, Any]]:
    """Run (or continue) every run of `suite` under `out` but those in `skip`; returns the
    per-run records."""
    runs = [r for r in plan_runs(suite, out) if (r.task, r.method, r.seed) not in skip]
    n = workers or suite.workers
    carried = f" ({len(skip)} carried from merge=)" if skip else ""
    print(
        f"bench learn {suite.name}: {len(runs)} runs{carried}, {n} at a time, into {out}",
        flush=True,
    )

    warm_simulators(suite, [r for r in runs if not (r.run_dir / DONE_FILE).exists()], out)
    # Each worker owns one core, so runs never share one (wall-clock budgets stay comparable).
    cores: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    available = sorted(os.sched_getaffinity(0))
    for i in range(n):
        cores.put(available[i] if n <= len(available) else None)

    def one(run: RunSpec) -> dict[str, Any]:
        core = cores.get()
        try:
            record = execute(run, core)
        finally:
            cores.put(core)
        status = "ok" if record["rc"] == 0 else f"FAILED rc={record['rc']} (see output.log)"
        print(f"  {run.task} {run.method} seed {run.seed}: {status}", flush=True)
        return {**asdict(run), "run_dir": str(run.run_dir), **record}

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, runs))


def _diff_ci(per_method: dict[str, Any], lora: str, dense: str, key: str) -> list[float] | None:
    """95 % bootstrap CI of mean(lora) − mean(dense) of a per-run number."""
    a, b = ([r[key] for r in per_method[m]["runs"]] for m in (lora, dense))
    ci = bench_stats.bootstrap_diff_ci(a, b)
    return list(ci) if ci else None


def carried_runs(path: Path, suite: Suite) -> dict[RunKey, dict[str, Any]]:
    """The finished runs (per-run numbers and curves) of an earlier results.json of `suite`."""
    from fast_lora_td3.bench.report import load_results

    results = load_results(path)
    if results["suite"] != suite.name:
        raise ConfigError(
            f"bench learn: merge={path} holds the {results['suite']!r} suite, not {suite.name!r}: "
            f"give a results.json of the {suite.name} suite"
        )
    return {
        (task, method, run["seed"]): run
        for task, t in results["tasks"].items()
        for method, m in t["methods"].items()
        for run in m["runs"]
        if run.get("rc") == 0
    }


def collect(
    suite: Suite,
    records: list[dict[str, Any]],
    carried: dict[RunKey, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per-run metrics and shrunk curves from each run's metrics.jsonl, plus the `carried` runs of
    an earlier results file, and the aggregates per task and method (tasks and methods without a
    run are left out)."""
    carried = carried or {}
    tasks: dict[str, Any] = {}
    for task in suite.tasks:
        per_method: dict[str, Any] = {}
        for method in task_methods(suite, task):
            mine = [r for r in records if r["task"] == task.key and r["method"] == method]
            runs = []
            for r in mine:
                rows = bench_stats.read_rows(Path(r["run_dir"]) / "metrics.jsonl")
                m = bench_stats.run_metrics(rows, task.checkpoints, task.threshold, task.wall_marks)
                run = {"seed": r["seed"], "rc": r["rc"], "run_dir": r["run_dir"], **m}
                runs.append({**run, "commit": r.get("commit"), "curves": run_curves(rows)})
            runs += [run for (t, mt, _), run in carried.items() if (t, mt) == (task.key, method)]
            if not runs:
                continue
            runs.sort(key=lambda run: run["seed"])
            per_method[method] = {
                "runs": runs,
                "summary": bench_stats.aggregate(runs, task.checkpoints),
            }
        comparisons = {}
        for lora, dense in LORA_PAIRS:
            if lora in per_method and dense in per_method:
                comparisons[f"{lora}-{dense}"] = {
                    f"{key}_diff_ci95": _diff_ci(per_method, lora, dense, key)
                    for key in ("final_eval_return", "auc_return")
                }
        if not per_method:
            continue
        tasks[task.key] = {
            "spec": asdict(task),
            "methods": per_method,
            "lora_vs_dense": comparisons,
        }
    seeds = sorted(
        {r["seed"] for t in tasks.values() for m in t["methods"].values() for r in m["runs"]}
    )
    return {"suite": suite.name, "note": suite.note, "seeds": seeds, "tasks": tasks}


def _commit() -> str | None:
    """The package checkout's commit (`-dirty` with uncommitted changes to tracked files); None
    outside a git checkout."""
    here = Path(__file__).resolve().parent
    git = ["git", "-C", str(here)]
    try:
        sha = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def run_bench_learn(args: list[str]) -> int:
    """Entry point of `fast-lora-td3 bench learn SUITE key=value…`."""
    from fast_lora_td3.bench.report import run_report, write_report

    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nsuites: {', '.join(SUITES)}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name == "report":
        return run_report(rest)
    if name not in SUITES:
        raise ConfigError(
            f"bench learn: unknown suite {name!r}: use one of {', '.join(SUITES)} "
            "(or `report RESULTS_JSON`)"
        )
    suite = full = SUITES[name]
    opts = {"out": f"bench_learn/{name}"} | dict.fromkeys(
        ("workers", "seeds", "only", "methods", "merge"), ""
    )
    for word in rest:
        key, eq, value = word.partition("=")
        if not eq or key not in opts:
            raise ConfigError(
                f"bench learn: bad argument {word!r}: use key=value, key one of {', '.join(opts)}"
            )
        opts[key] = value
    try:
        if opts["seeds"]:
            seeds = tuple(int(s) for s in opts["seeds"].split(","))
            tasks = tuple(replace(t, seeds=None) for t in suite.tasks)
            suite = replace(suite, seeds=seeds, tasks=tasks)
        workers = int(opts["workers"]) if opts["workers"] else None
    except ValueError:
        raise ConfigError("bench learn: seeds=1,2,3 and workers=N take integers") from None
    if opts["only"]:
        keep = set(opts["only"].split(","))
        unknown = keep - {t.key for t in suite.tasks}
        if unknown:
            raise ConfigError(f"bench learn: only={','.join(sorted(unknown))} not in the suite")
        suite = replace(suite, tasks=tuple(t for t in suite.tasks if t.key in keep))
    methods = set(opts["methods"].split(",")) if opts["methods"] else set()
    suite = only_methods(suite, methods) if methods else suite
    out = Path(opts["out"])
    carried = carried_runs(Path(opts["merge"]), full) if opts["merge"] else {}
    # methods=: this invocation's runs of those methods (its tasks and seeds) replace the earlier
    # file's; the file's other tasks and seeds of those methods are carried.
    planned = {(r.task, r.method, r.seed) for r in plan_runs(suite, out)}
    carried = {k: run for k, run in carried.items() if k[1] not in methods or k not in planned}
    records = run_suite(suite, out, workers, skip=frozenset(carried))
    if carried:  # the merged file keeps every task and seed it had (the specs are the suite's)
        suite = replace(full, tasks=tuple(replace(t, seeds=None) for t in full.tasks))
    command = " ".join(["fast-lora-td3", "bench", "learn", *args])
    results = {
        "suite": suite.name,
        "command": command,
        "commit": _commit(),
        **collect(suite, records, carried),
    }
    write_report(results, out)
    failed = [r for r in records if r["rc"] != 0]
    print(f"wrote {out / 'results.json'}, {out / 'results.md'} and plots", flush=True)
    if failed:
        print(f"bench learn: {len(failed)} run(s) failed (see their output.log)", file=sys.stderr)
        return 1
    return 0
