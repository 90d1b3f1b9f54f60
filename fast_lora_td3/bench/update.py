"""`bench update`: critic updates with everything the recipe runs around them, one JSON line each.

n-step sampling from a real ReplayBuffer filled with random data, observation normalisation inside
the losses, the delayed actor update every `policy_frequency` critic updates, Polyak, and on-device
metric sums. It also counts the GEMM FLOPs of one update (torch.utils.flop_counter) and reports
them against the measured square-matmul FLOP/s of the device (`gemm_fraction`) and against a
batched GEMM of the critic's own largest layer (`gemm_fraction_shape`), same threads. `rounds=N`
alternates every timed configuration (dense twin, LoRA, modes) and both GEMM meters in N rounds and
reports medians, so ratios such as `lora_overhead` hold on a shared, loaded machine.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fast_lora_td3.algos import make_learner
from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.bench.config import ALIASES, UpdateBenchConfig, flat_defaults, with_family
from fast_lora_td3.bench.meters import (
    count_update_flops,
    filled_replay,
    gemm_gflops,
    gemm_meter_gflops,
    sync,
)
from fast_lora_td3.config.validate import check_batch_divides, resolve_device
from fast_lora_td3.replay.buffer import ReplayBuffer
from fast_lora_td3.training.compile_setup import configure_backends
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig

__all__ = ["UPDATE_DEFAULTS", "bench_update", "implementation", "time_update"]

# mode → UpdateStep flags. "graphed" captures the compiled step, "graphed_eager" the eager one.
_MODE_FLAGS = {
    "eager": {"compile": False, "cuda_graph": False},
    "compiled": {"compile": True, "cuda_graph": False},
    "graphed": {"compile": True, "cuda_graph": True, "graph_impl": "manual"},
    "graphed_eager": {"compile": False, "cuda_graph": True, "graph_impl": "manual"},
    "reduce_overhead": {"compile": True, "cuda_graph": True, "graph_impl": "reduce_overhead"},
}
_DENSE_OF = {"simbav2_lora": "simbav2", "mlp_lora": "mlp"}


def _as_word(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


_SCRIPT_KEYS = ("algo", "critic", "critic.hidden_dims", "critic.width", "critic.num_blocks")
_SCRIPT_KEYS += ("critic.rank", "actor.hidden_dims", "batch_size", "obs_dim", "critic_obs_dim")
_SCRIPT_KEYS += ("action_dim", "num_atoms", "num_envs", "buffer_size", "n_step")
_SCRIPT_KEYS += ("policy_frequency", "amp", "device", "compare_dense", "seed")
UPDATE_DEFAULTS: dict[str, str] = {
    key: _as_word(flat_defaults(UpdateBenchConfig)[ALIASES.get(key, key)]) for key in _SCRIPT_KEYS
}
"""String options of scripts/device_check.py (the `bench update` defaults it starts from)."""


def _meter_shapes(cfg: UpdateBenchConfig, family: str, batch: int) -> dict[str, tuple]:
    """`square`: the 2048² (CPU) / 8192² (CUDA) GEMM of gemm_gflops; `update`: the critic's
    largest forward GEMM at this batch (both members)."""
    members = 2
    if family.startswith("mlp"):
        dims = [cfg.obs_dim + cfg.action_dim, *cfg.critic.hidden_dims]
        k, n = max(itertools.pairwise(dims), key=lambda d: d[0] * d[1])
    else:
        k, n = cfg.critic.width, 4 * cfg.critic.width
    return {"square": (1, 2048, 2048, 2048), "update": (members, batch, k, n)}


@contextlib.contextmanager
def implementation(name: str) -> Iterator[None]:
    """`fast`: the code as it is. `reference`: the pre-issue-10 update (autograd through
    F.normalize and through the merged LoRA weight, `foreach` AdamW), so `impls=fast,reference`
    measures both in one process, alternating in rounds (a speed A/B, never used to train)."""
    if name == "fast":
        yield
        return
    from fast_lora_td3.algos import base as algos_base
    from fast_lora_td3.nn import layers
    from fast_lora_td3.nn.lora import LoRALinear

    def l2_apply(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
        return torch.nn.functional.normalize(x, p=2.0, dim=dim, eps=eps)

    def lora_forward(self: LoRALinear, x: torch.Tensor) -> torch.Tensor:
        return layers.ensemble_linear(x, self.effective_weight(), self.bias)

    def foreach_adamw(
        groups: list[dict], lr: float, betas: Any, device: torch.device
    ) -> torch.optim.AdamW:
        fused = device.type == "cuda"
        return torch.optim.AdamW(
            groups, lr=lr, betas=tuple(betas), fused=fused, foreach=None if fused else True
        )

    saved = (LoRALinear.forward, algos_base.make_adamw)
    layers._L2Normalize.apply = l2_apply  # type: ignore[method-assign]  # shadows Function.apply
    LoRALinear.forward = lora_forward  # type: ignore[method-assign]
    algos_base.make_adamw = foreach_adamw
    try:
        yield
    finally:
        del layers._L2Normalize.apply  # the inherited autograd.Function.apply again
        LoRALinear.forward, algos_base.make_adamw = saved  # type: ignore[method-assign]


class _Update:
    """Builds the learner of one critic family from a bench config (seeded the same every time)."""

    def __init__(
        self,
        cfg: UpdateBenchConfig | dict[str, str],
        device: torch.device,
        given: set[str] = frozenset(),
    ) -> None:
        if isinstance(cfg, dict):  # scripts/device_check.py's string options
            from fast_lora_td3.bench.config import parse_bench_config

            words = [f"{k}={v}" for k, v in cfg.items()]
            cfg, given = parse_bench_config(words, UpdateBenchConfig)
        self.cfg, self.device, self.given = cfg, device, given

    def learner(self, family: str) -> OffPolicyLearner:
        cfg = self.cfg
        act = cfg.critic.activation
        if "critic.activation" not in self.given:  # the algorithm's recipe
            act = "silu_layernorm" if cfg.algo.name == "fastsac" else "relu"
        critic = with_family(copy.copy(cfg.critic), family, self.given)
        critic.activation = act
        actor = copy.copy(cfg.actor)
        if "actor.activation" not in self.given:
            actor.activation = act
        torch.manual_seed(cfg.seed)
        obs, cobs = cfg.obs_dim, cfg.critic_obs_dim
        return make_learner(
            cfg.algo, critic, actor, obs, cobs or obs, cfg.action_dim, self.device, amp=cfg.amp
        )


def _widths(cfg: UpdateBenchConfig, family: str) -> dict[str, Any]:
    if family.startswith("mlp"):
        widths: dict[str, Any] = {"hidden_dims": list(cfg.critic.hidden_dims)}
    else:
        widths = {"width": cfg.critic.width, "num_blocks": cfg.critic.num_blocks}
    if family.endswith("_lora"):
        widths["rank"] = cfg.critic.rank
    return widths


def time_update(
    step: UpdateStep, replay: ReplayBuffer, batch_size: int, iters: int, warmup: int, pf: int
) -> tuple[float, float]:
    """(seconds per critic update, seconds of the first call) for the trainer's loop body."""
    device = step.device
    sums: dict[str, torch.Tensor] = {}

    def one() -> None:
        batch = replay.sample_nstep(batch_size)
        for k, v in step(batch).items():
            sums[k] = sums[k] + v if k in sums else v.clone()

    start = time.perf_counter()
    one()
    sync(device)
    first = time.perf_counter() - start
    for _ in range(max(warmup, pf) - 1):
        one()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        one()
    sync(device)
    return (time.perf_counter() - start) / iters, first


def bench_update(
    cfg: UpdateBenchConfig, emit: Callable[[dict[str, Any]], None], given: set[str] = frozenset()
) -> list[dict]:
    """Run `bench update` for every mode (and the dense twin of a LoRA family); emit each record.
    `given`: the dotted keys the command line set (others may follow the algorithm's recipe)."""
    device = torch.device(resolve_device(cfg.device))
    configure_backends(device)
    modes = cfg.mode_list
    algo = cfg.algo
    batch, num_envs = algo.batch_size, cfg.num_envs
    check_batch_divides(batch, num_envs)
    iters, warmup, pf = cfg.iters, cfg.warmup, algo.policy_frequency
    obs, cobs, act = cfg.obs_dim, cfg.critic_obs_dim, cfg.action_dim
    replay = filled_replay(
        num_envs, algo.buffer_size, obs, act, device, critic_obs_dim=cobs, n_step=algo.n_step
    )
    family = cfg.critic.family
    families = [family]
    if family in _DENSE_OF and cfg.compare_dense:
        families.insert(0, _DENSE_OF[family])
    dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float32
    peak = gemm_gflops(device, dtype)
    rounds = cfg.rounds
    factory = _Update(cfg, device, given)
    impls = cfg.impl_list
    runs: list[dict[str, Any]] = []  # one per (family, mode, impl), in report order
    for fam in families:
        for impl in impls:
            with implementation(impl):
                learner = factory.learner(fam)
                flops_c, flops_a = count_update_flops(learner, replay.sample_nstep(batch), pf)
            for mode in modes:
                run = {"fam": fam, "mode": mode, "impl": impl, "step": None, "times": []}
                if not (device.type == "cpu" and _MODE_FLAGS[mode]["cuda_graph"]):
                    config = UpdateStepConfig(**_MODE_FLAGS[mode], policy_frequency=pf)
                    run["step"] = UpdateStep(copy.deepcopy(learner), config)
                    run["flops"] = flops_c + flops_a / pf
                runs.append(run)
    # Rounds alternate every (family, mode, impl) and the GEMM meters, so a ratio between any two
    # of them compares the same stretch of a shared machine's load (medians over rounds are kept).
    timed = [r for r in runs if r["step"] is not None]
    meters: dict[str, list[float]] = {"square": [], "update": []}
    shapes = _meter_shapes(cfg, family, batch)
    for r in range(rounds):
        for run in timed:
            if device.type == "cuda" and r == 0:
                torch.cuda.reset_peak_memory_stats(device)
            with implementation(run["impl"]):
                sec, first = time_update(
                    run["step"], replay, batch, iters, warmup if r == 0 else 0, pf
                )
            run["times"].append(sec)
            if r == 0:
                run["first"] = first
                if device.type == "cuda":
                    run["peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        if rounds > 1:
            for key, shape in shapes.items():
                meters[key].append(gemm_meter_gflops(device, dtype, shape))
    if rounds == 1:  # one pass: the square meter is gemm_gflops' best-of-5 (as before)
        meters = {"square": [peak], "update": [gemm_meter_gflops(device, dtype, shapes["update"])]}
    square, shape_peak = statistics.median(meters["square"]), statistics.median(meters["update"])
    by_key = {(r["fam"], r["mode"], r["impl"]): r for r in timed}
    records = []
    for run in runs:
        fam, mode, impl, step = run["fam"], run["mode"], run["impl"], run["step"]
        if step is None:
            emit({"name": "update", "critic": fam, "mode": mode, "skipped": "needs CUDA"})
            continue
        sec, flops = statistics.median(run["times"]), run["flops"]
        rec = {
            "name": "update",
            "algo": algo.name,
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            "critic": fam,
            "mode": step.mode,
            "impl": impl,
            "batch_size": batch,
            "widths": _widths(cfg, fam),
            "obs_dim": obs,
            "action_dim": act,
            "num_atoms": algo.num_atoms,
            "amp": cfg.amp,
            "updates_per_s": 1.0 / sec,
            "samples_per_s": batch / sec,
            "ms_per_update": 1e3 * sec,
            "first_call_s": run["first"],
            "gflop_per_update": flops / 1e9,
            "achieved_gflops": flops / sec / 1e9,
            "device_gemm_gflops": square,
            "gemm_fraction": flops / sec / 1e9 / square,
            "shape_gemm_gflops": shape_peak,
            "gemm_fraction_shape": flops / sec / 1e9 / shape_peak,
            "meter_shapes": {k: list(v) for k, v in shapes.items()},
            "rounds": rounds,
            "round_ms": [1e3 * t for t in run["times"]],
            "threads": torch.get_num_threads(),
        }
        if "peak_mem_mb" in run:
            rec["peak_mem_mb"] = run["peak_mem_mb"]
        dense = by_key.get((_DENSE_OF.get(fam), mode, impl))
        if dense is not None:
            per_round = [a / b for a, b in zip(run["times"], dense["times"], strict=True)]
            rec["lora_overhead_rounds"] = per_round
            rec["lora_overhead"] = statistics.median(per_round)
        ref = by_key.get((fam, mode, "reference"))
        if impl != "reference" and ref is not None:
            per_round = [b / a for a, b in zip(run["times"], ref["times"], strict=True)]
            rec["speedup_vs_reference_rounds"] = per_round
            rec["speedup_vs_reference"] = statistics.median(per_round)
        emit(rec)
        records.append(rec)
    return records
