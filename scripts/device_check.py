#!/usr/bin/env python
"""The one prepared GPU check (issue 5): torch only, no simulator, JSON lines on stdout, < 5 min.

Parts, most important first (each guarded: a failure prints `{"part": …, "error": …}` and the
script goes on; parts that would overrun `--budget-s` print `{"skipped": "time budget"}`):

* `env`: torch / device, measured square-matmul GFLOP/s (fp32-TF32 and bf16).
* per config (FastTD3 SimbaV2-LoRA b8192, dense SimbaV2 b8192, FastTD3 MLP b32768, FastSAC MLP
  b8192; obs 123, act 37) and mode (eager, graphed_eager = CUDAGraph over eager, graphed = CUDAGraph
  over compiled, reduce_overhead, compiled): `parity` (3 updates from the same state and seed vs
  eager: max metric diff and relative parameter-update error), `update` (updates/s, samples/s,
  GEMM GFLOP/s, peak memory; timed with replay sampling, delayed actor updates, Polyak), and
  `sync_debug` (the step under torch.cuda.set_sync_debug_mode("error")).
* `reward_scale_live` (issue 17): the default (automatic value range) SimbaV2-LoRA update with the
  reward scale changed between steps, as the collector changes it; each mode (graphed_eager,
  graphed on CUDA; compiled on CPU) vs eager: a graph that froze the scale at capture would differ.
* `lora_ratio`: simbav2_lora / simbav2 time per update, per mode (target ≤ 1.05).
* `auto_select` (runs first, issue 10): the G1 FastTD3-LoRA preset's update (simbav2_lora, b8192,
  amp bf16) with `compile=auto cuda_graph=auto`, and with `cuda_graph=false`: the mode the
  start-up parity check chose (graphed → compiled → eager), its one-line reason, the seconds the
  choice took, and updates/s of the chosen step. `--cpu-smoke` runs the same chain with the
  candidates (compiled, eager) — graphs need CUDA — and the aot_eager backend.
* `auto_fp32`: `compile=auto cuda_graph=auto` on the default fp32 update of FastSAC and FastTD3
  (MLP critics, b8192): the mode a user's run gets and its one-line reason.
* `verify_spread`: verify_compile (the start-up parity check of `compile=auto`) with its
  tolerances off, on three batches per fp32 config (`amp=none`, the default) and mode: the errors
  that its fp32 tolerance must admit.

`--cpu-smoke` runs the same code paths with tiny sizes on CPU (compile backend aot_eager).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fast_lora_td3.bench.meters import count_update_flops, filled_replay, gemm_gflops
from fast_lora_td3.bench.update import _MODE_FLAGS, UPDATE_DEFAULTS, _Update, time_update
from fast_lora_td3.training import update_step
from fast_lora_td3.training.compile_setup import configure_backends
from fast_lora_td3.training.update_mode import ModeFlags
from fast_lora_td3.training.update_step import (
    _TOLERANCES,
    BATCH_FIELDS,
    UpdateStep,
    UpdateStepConfig,
    tolerance_precision,
    verify_compile,
)

REFERENCE = {"obs_dim": "123", "action_dim": "37", "num_atoms": "251", "num_envs": "1024"}
CONFIGS = [
    ("td3_simbav2_lora", {"algo": "fasttd3", "critic": "simbav2_lora", "batch_size": "8192"},
     ["eager", "graphed_eager", "graphed", "reduce_overhead", "compiled"]),
    ("td3_simbav2_dense", {"algo": "fasttd3", "critic": "simbav2", "batch_size": "8192"},
     ["eager", "graphed_eager", "graphed"]),
    ("td3_mlp", {"algo": "fasttd3", "critic": "mlp", "batch_size": "32768"},
     ["eager", "graphed_eager", "graphed"]),
    ("sac_mlp", {"algo": "fastsac", "critic": "mlp", "batch_size": "8192", "num_atoms": "101",
                 "critic.hidden_dims": "768,384,192"},
     ["eager", "graphed_eager", "compiled"]),
]  # fmt: skip
FP32_CONFIGS = [  # what `train` verifies on CUDA with the default amp=none
    ("sac_mlp", CONFIGS[3][1], ["graphed_eager", "graphed", "compiled"]),
    ("td3_mlp", {"algo": "fasttd3", "critic": "mlp", "batch_size": "8192"},
     ["graphed_eager", "graphed", "compiled"]),
    ("td3_simbav2_lora", CONFIGS[0][1], ["graphed_eager", "graphed"]),
]  # fmt: skip
SMOKE = {
    "obs_dim": "6", "action_dim": "2", "num_atoms": "11", "num_envs": "8", "batch_size": "32",
    "critic.hidden_dims": "32,32", "actor.hidden_dims": "16", "critic.width": "16",
    "critic.num_blocks": "1", "critic.rank": "4",
}  # fmt: skip


_STARTED = time.perf_counter()


def emit(record: dict[str, Any]) -> None:
    """One JSON line, flushed (the run may be cut short by a timeout), with the seconds since start
    (`at_s`: a slow or stuck part shows where the time went)."""
    record = {**record, "at_s": round(time.perf_counter() - _STARTED, 1)}
    print(json.dumps(record, default=str), flush=True)


def guarded(part: dict[str, Any], fn: Any) -> Any:
    """Run fn(); on failure print the part with its error (one line) and return None."""
    try:
        return fn()
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        emit({**part, "error": msg, "where": traceback.format_exc().splitlines()[-3][:200]})
        return None


def run_parity(
    step: UpdateStep,
    batches: list[Any],
    seed: int,
    start: dict[str, torch.Tensor],
    before: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], float]:
    """One update per batch from the learner's current state (`before(i)` runs ahead of update
    i); returns metrics, final tensors, first-call s."""
    torch.manual_seed(seed)
    history, first = [], 0.0
    for i, batch in enumerate(batches):
        if before is not None:
            before(i)
        t0 = time.perf_counter()
        out = step(batch)
        history.append({k: float(v) for k, v in out.items()})
        if i == 0:
            first = time.perf_counter() - t0
    tensors = {n: t.detach().clone() for n, t in step.learner.state_tensors() if n in start}
    return history, tensors, first


def compare(ref: tuple, test: tuple, start: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Max metric |diff| (abs and relative) and max relative parameter-update error."""
    m_abs = m_rel = 0.0
    for me, mt in zip(ref[0], test[0], strict=True):
        for k, v in me.items():
            d = abs(mt[k] - v)
            m_abs, m_rel = max(m_abs, d), max(m_rel, d / (abs(v) + 1e-6))
    u_rel, worst = 0.0, ""
    for name, te in ref[1].items():
        if name.startswith("optimizer") or not te.is_floating_point():
            continue
        moved = (te.float() - start[name].float()).norm().item()
        diff = (test[1][name].float() - te.float()).norm().item()
        rel = diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf"))
        if rel > u_rel:
            u_rel, worst = rel, name
    return {"max_metric_abs_diff": m_abs, "max_metric_rel_diff": m_rel,
            "max_update_rel_err": u_rel, "worst_tensor": worst}  # fmt: skip


def check_config(name: str, opts: dict[str, str], modes: list[str], ctx: dict[str, Any]) -> None:
    """Parity, throughput and sync checks of one config across modes."""
    device, deadline = ctx["device"], ctx["deadline"]
    factory = _Update(opts, device)
    base = factory.learner(opts["critic"])
    batch_size, pf = int(opts["batch_size"]), int(opts["policy_frequency"])
    replay = filled_replay(int(opts["num_envs"]), 16, int(opts["obs_dim"]),
                           int(opts["action_dim"]), device, n_step=8)  # fmt: skip
    batches = []
    for _ in range(3):
        sample = replay.sample_nstep(batch_size)
        batches.append(type("B", (), {f: getattr(sample, f).clone() for f in BATCH_FIELDS})())
    flops_c, flops_a = count_update_flops(base, batches[0], pf)
    flops = flops_c + flops_a / pf
    start = {n: t.detach().clone() for n, t in base.state_tensors()}
    reference = None
    for mode in modes:
        part = {"part": "update", "config": name, "mode": mode}
        if time.perf_counter() > deadline:
            emit({**part, "skipped": "time budget"})
            continue
        flags = dict(_MODE_FLAGS[mode])
        if flags["cuda_graph"] and device.type != "cuda":
            emit({**part, "skipped": "needs CUDA"})
            continue

        def one(mode: str = mode, flags: dict = flags, part: dict = part) -> None:
            nonlocal reference
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            config = UpdateStepConfig(
                **flags, compile_backend=ctx["backend"] or "inductor", policy_frequency=pf
            )
            step = UpdateStep(copy.deepcopy(base), config)
            result = run_parity(step, batches, 1234, start)
            if reference is None:
                reference = result
            else:
                emit({"part": "parity", "config": name, "mode": mode, "vs": "eager",
                      **compare(reference, result, start)})  # fmt: skip
            sec, _ = time_update(step, replay, batch_size, ctx["iters"], ctx["warmup"], pf)
            ctx["seconds"][(name, mode)] = sec
            rec = {**part, "algo": opts["algo"], "critic": opts["critic"],
                   "batch_size": batch_size, "updates_per_s": 1 / sec,
                   "samples_per_s": batch_size / sec, "ms_per_update": 1e3 * sec,
                   "first_call_s": result[2], "gflop_per_update": flops / 1e9,
                   "achieved_gflops": flops / sec / 1e9}  # fmt: skip
            if device.type == "cuda":
                rec["peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            emit(rec)
            if device.type == "cuda":
                guarded({"part": "sync_debug", "config": name, "mode": mode},
                        lambda: sync_debug(step, batches, name, mode))  # fmt: skip

        guarded(part, one)


def sync_debug(step: UpdateStep, batches: list[Any], name: str, mode: str) -> None:
    """Run the step with host syncs turned into errors."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(2):
            step(batches[i])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    emit({"part": "sync_debug", "config": name, "mode": mode, "ok": True})


def auto_select(ctx: dict[str, Any], smoke: bool) -> None:
    """The automatic mode choice exactly as `fast-lora-td3 train` makes it (UpdateStep, auto)."""
    device = ctx["device"]
    opts = {**UPDATE_DEFAULTS, **REFERENCE, "critic": "simbav2_lora", "batch_size": "8192"}
    opts["amp"] = "bf16" if device.type == "cuda" else "none"
    if smoke:
        opts.update(SMOKE)
        # CPU: `auto` is eager, so run the CUDA chain without graphs (they need CUDA).
        update_step.mode_candidates = lambda *a, **k: (
            [ModeFlags(True, False), ModeFlags(False, False)],
            "cpu-smoke: the CUDA candidates without graphs",
        )
    replay = filled_replay(int(opts["num_envs"]), 16, int(opts["obs_dim"]),
                           int(opts["action_dim"]), device, n_step=8)  # fmt: skip
    batch_size, pf = int(opts["batch_size"]), int(opts["policy_frequency"])
    for graph in ("auto",) if smoke else ("auto", "false"):
        part = {"part": "auto_select", "compile": "auto", "cuda_graph": graph}
        if time.perf_counter() > ctx["deadline"]:
            emit({**part, "skipped": "time budget"})
            continue

        def one(graph: str = graph, part: dict = part) -> None:
            learner = _Update(opts, device).learner("simbav2_lora")
            cfg = UpdateStepConfig(
                compile="auto",
                cuda_graph=graph,
                compile_backend=ctx["backend"] or "inductor",
                policy_frequency=pf,
            )
            step = UpdateStep(learner, cfg)
            t0 = time.perf_counter()
            step(replay.sample_nstep(batch_size))
            choose_s = time.perf_counter() - t0
            sec, _ = time_update(step, replay, batch_size, ctx["iters"], ctx["warmup"], pf)
            emit({**part, "mode": step.mode, "verified": step.verified, "line": step.selection,
                  "choose_s": choose_s, "updates_per_s": 1 / sec})  # fmt: skip

        guarded(part, one)


def _spread(learner: Any, replay: Any, batch_size: int, cfg: UpdateStepConfig) -> dict[str, Any]:
    """verify_compile on three fresh batches with every tolerance off: the measured errors."""
    inf, update_errs, metric_diffs = float("inf"), [], []
    for _ in range(3):
        batch = replay.sample_nstep(batch_size)
        r = verify_compile(learner, lambda b=batch: b, cfg, rtol=inf, atol=inf, update_rtol=inf)
        update_errs.append(r["max_update_rel_err"])
        metric_diffs.append(r["max_metric_diff"])
    return {"update_rel_err": update_errs, "max_metric_diff": metric_diffs,
            "update_rtol": _TOLERANCES[tolerance_precision(False, learner.device)][2]}  # fmt: skip


def _auto_mode(learner: Any, replay: Any, batch_size: int, cfg: UpdateStepConfig) -> dict[str, Any]:
    """The mode an `auto` UpdateStep chooses at its first call, and its one-line reason."""
    step = UpdateStep(learner, cfg)
    step(replay.sample_nstep(batch_size))
    return {"mode": step.mode, "line": step.selection}


def _fp32_setup(over: dict[str, str], ctx: dict[str, Any], smoke: bool) -> tuple:
    """(options, filled replay, learner) of one FP32_CONFIGS entry."""
    opts = {**UPDATE_DEFAULTS, **REFERENCE, **over, **(SMOKE if smoke else {})}
    replay = filled_replay(int(opts["num_envs"]), 16, int(opts["obs_dim"]),
                           int(opts["action_dim"]), ctx["device"], n_step=8)  # fmt: skip
    return opts, replay, _Update(opts, ctx["device"]).learner(opts["critic"])


def _emit_part(part: dict[str, Any], deadline: float, fn: Callable[..., dict], *args: Any) -> None:
    """Run fn(*args) guarded and emit the part with its result, unless past the deadline."""
    if time.perf_counter() > deadline:
        emit({**part, "skipped": "time budget"})
        return
    out = guarded(part, lambda: fn(*args))
    if out is not None:
        emit({**part, **out})


def verify_spread(ctx: dict[str, Any], smoke: bool) -> None:
    """verify_compile's errors with its tolerances off: three batches per fp32 config and mode."""
    for name, over, modes in FP32_CONFIGS:
        opts, replay, learner = _fp32_setup(over, ctx, smoke)
        for mode in ["compiled"] if smoke else modes:
            cfg = UpdateStepConfig(**_MODE_FLAGS[mode], compile_backend=ctx["backend"],
                                   policy_frequency=int(opts["policy_frequency"]))  # fmt: skip
            part = {"part": "verify_spread", "config": name, "mode": mode}
            args = (learner, replay, int(opts["batch_size"]), cfg)
            _emit_part(part, ctx["deadline"], _spread, *args)


def auto_fp32(ctx: dict[str, Any], smoke: bool) -> None:
    """The mode `compile=auto cuda_graph=auto` gives the default fp32 FastSAC / FastTD3 update."""
    for name, over, _ in FP32_CONFIGS[:2]:
        opts, replay, learner = _fp32_setup(over, ctx, smoke)
        cfg = UpdateStepConfig(compile="auto", cuda_graph="auto", compile_backend=ctx["backend"],
                               policy_frequency=int(opts["policy_frequency"]))  # fmt: skip
        part = {"part": "auto_fp32", "config": name}
        args = (learner, replay, int(opts["batch_size"]), cfg)
        _emit_part(part, ctx["deadline"], _auto_mode, *args)


def reward_scale_live(ctx: dict[str, Any], smoke: bool) -> None:
    """Compiled and graphed steps read the reward scale that the collector updates between them."""
    device = ctx["device"]
    opts = {**UPDATE_DEFAULTS, **REFERENCE, "critic": "simbav2_lora", "batch_size": "8192"}
    opts.update(SMOKE if smoke else {})
    replay = filled_replay(int(opts["num_envs"]), 16, int(opts["obs_dim"]),
                           int(opts["action_dim"]), device, n_step=8)  # fmt: skip
    batches = [replay.sample_nstep(int(opts["batch_size"])) for _ in range(4)]
    envs = int(opts["num_envs"])
    returns = [torch.linspace(-1.0, 1.0, envs, device=device) * 50.0 * 4**i for i in range(4)]
    modes = ["eager", "compiled"] if smoke else ["eager", "graphed_eager", "graphed"]
    reference = None
    for mode in modes:
        part = {"part": "reward_scale_live", "mode": mode}

        def one(mode: str = mode, part: dict = part) -> None:
            nonlocal reference
            learner = _Update(opts, device).learner("simbav2_lora")
            assert learner.reward_scaler is not None, "bench defaults lost the automatic range"
            cfg = UpdateStepConfig(
                **_MODE_FLAGS[mode], compile_backend=ctx["backend"] or "inductor"
            )
            step = UpdateStep(learner, cfg)
            start = {n: t.detach().clone() for n, t in learner.state_tensors()}
            scales: list[float] = []

            def rescale(i: int) -> None:  # between steps, as the collector does
                learner.update_reward_scale(returns[i])
                scales.append(float(learner.reward_scaler.scale()))

            result = run_parity(step, batches, 1234, start, before=rescale)
            if reference is None:
                reference = (result, start)
                emit({**part, "scales": scales})
                return
            emit({**part, "vs": "eager", "scales": scales,
                  **compare(reference[0], result, reference[1])})  # fmt: skip

        guarded(part, one)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run every part within the time budget, print JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (code paths only)")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting parts after this")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--backend", default=None, help="torch.compile backend (default inductor)")
    ap.add_argument("--only", default="", help="comma list of config names to run")
    ns = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not ns.cpu_smoke
    device = torch.device("cuda" if cuda else "cpu")
    configure_backends(device)
    ctx = {"device": device, "deadline": _STARTED + ns.budget_s, "seconds": {},
           "iters": 3 if ns.cpu_smoke else ns.iters, "warmup": 2 if ns.cpu_smoke else 5,
           "backend": ns.backend or ("aot_eager" if ns.cpu_smoke else "inductor")}  # fmt: skip
    env = {"part": "env", "torch": torch.__version__, "device": str(device)}
    if cuda:
        env["device_name"] = torch.cuda.get_device_name(device)
    env["gemm_gflops_fp32"] = gemm_gflops(device, torch.float32)
    env["gemm_gflops_bf16"] = guarded({"part": "env"}, lambda: gemm_gflops(device, torch.bfloat16))
    emit(env)
    only = {c for c in ns.only.split(",") if c}
    if not only or "auto_select" in only:
        auto_select(ctx, ns.cpu_smoke)
    if not only or "reward_scale_live" in only:
        reward_scale_live(ctx, ns.cpu_smoke)
    if not only or "auto_fp32" in only:
        auto_fp32(ctx, ns.cpu_smoke)
    if not only or "verify_spread" in only:
        verify_spread(ctx, ns.cpu_smoke)
    for name, over, modes in CONFIGS:
        if only and name not in only:
            continue
        opts = {**UPDATE_DEFAULTS, **REFERENCE, **over, **(SMOKE if ns.cpu_smoke else {})}
        guarded({"part": "config", "config": name}, lambda n=name, o=opts, m=modes:
                check_config(n, o, m, ctx))  # fmt: skip
    for mode in _MODE_FLAGS:
        lora = ctx["seconds"].get(("td3_simbav2_lora", mode))
        dense = ctx["seconds"].get(("td3_simbav2_dense", mode))
        if lora and dense:
            emit({"part": "lora_ratio", "mode": mode, "ratio": lora / dense, "target": 1.05})
    emit({"part": "done", "wall_s": time.perf_counter() - _STARTED})
    return 0


if __name__ == "__main__":
    sys.exit(main())
