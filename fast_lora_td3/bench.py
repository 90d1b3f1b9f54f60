"""`fast-lora-td3 bench update|replay key=value…`: throughput benchmarks, one JSON line per result.

`bench update` times critic updates with everything the recipe runs around them (SPEC §12, §13):
n-step sampling from a real ReplayBuffer filled with random data, observation normalisation inside
the losses, the delayed actor update every `policy_frequency` critic updates, Polyak, and on-device
metric sums. It also counts the GEMM FLOPs of one update (torch.utils.flop_counter) and reports
them against the measured square-matmul FLOP/s of the device (`gemm_fraction`) and against a
batched GEMM of the critic's own largest layer (`gemm_fraction_shape`), same threads. `rounds=N`
alternates every timed configuration (dense twin, LoRA, modes) and both GEMM meters in N rounds and
reports medians, so ratios such as `lora_overhead` hold on a shared, loaded machine. `bench replay` reports bytes per
transition against a buffer that stores next_obs explicitly, and the samples/s of `sample_nstep`.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from fast_lora_td3.algos import AlgoConfig, make_learner
from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.compile_setup import configure_backends
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import ActorConfig, CriticConfig
from fast_lora_td3.replay import _OBS_DTYPES, ReplayBuffer
from fast_lora_td3.update_step import UpdateStep, UpdateStepConfig

__all__ = [
    "MODES",
    "bench_replay",
    "bench_update",
    "count_update_flops",
    "filled_replay",
    "gemm_gflops",
    "parse_options",
    "run_bench",
]

MODES = ("eager", "compiled", "graphed", "graphed_eager", "reduce_overhead")
# mode → UpdateStep flags. "graphed" captures the compiled step, "graphed_eager" the eager one.
_MODE_FLAGS = {
    "eager": {"compile": False, "cuda_graph": False},
    "compiled": {"compile": True, "cuda_graph": False},
    "graphed": {"compile": True, "cuda_graph": True, "graph_impl": "manual"},
    "graphed_eager": {"compile": False, "cuda_graph": True, "graph_impl": "manual"},
    "reduce_overhead": {"compile": True, "cuda_graph": True, "graph_impl": "reduce_overhead"},
}
_DENSE_OF = {"simbav2_lora": "simbav2", "mlp_lora": "mlp"}

UPDATE_DEFAULTS: dict[str, str] = {
    "algo": "fasttd3",
    "critic": "mlp",
    "critic.hidden_dims": "1024,512,256",
    "critic.width": "512",
    "critic.num_blocks": "2",
    "critic.rank": "96",
    "critic.activation": "",
    "actor.hidden_dims": "512,256,128",
    "batch_size": "8192",
    "obs_dim": "123",
    "critic_obs_dim": "0",
    "action_dim": "37",
    "num_atoms": "251",
    "num_envs": "1024",
    "buffer_size": "32",
    "n_step": "8",
    "policy_frequency": "2",
    "amp": "none",
    "device": "auto",
    "modes": "eager",
    "iters": "20",
    "warmup": "3",
    "compare_dense": "true",
    "threads": "0",
    "seed": "0",
    "rounds": "1",
    "impls": "fast",
}
REPLAY_DEFAULTS: dict[str, str] = {
    "obs_dim": "123",
    "critic_obs_dim": "0",
    "action_dim": "37",
    "num_envs": "1024",
    "buffer_size": "256",
    "n_step": "8",
    "obs_dtype": "float32",
    "action_dtype": "float32",
    "batch_size": "8192",
    "max_episode_length": "1000",
    "device": "auto",
    "iters": "50",
    "warmup": "5",
    "threads": "0",
}
_ALIASES = {"critic.family": "critic", "mode": "modes", "algo.batch_size": "batch_size"}


def parse_options(words: list[str], defaults: dict[str, str]) -> dict[str, str]:
    """`key=value` words over `defaults`; an unknown key or a word without `=` is a ConfigError."""
    opts = dict(defaults)
    for word in words:
        key, sep, value = word.partition("=")
        key = _ALIASES.get(key.lstrip("+"), key.lstrip("+"))
        if not sep or key not in defaults:
            raise ConfigError(
                f"bench: bad argument {word!r}: use key=value with key one of {', '.join(defaults)}"
            )
        opts[key] = value
    return opts


def _int(opts: dict[str, str], key: str, minimum: int = 1) -> int:
    try:
        value = int(opts[key])
    except ValueError:
        raise ConfigError(f"bench: {key}={opts[key]!r} must be an integer") from None
    if value < minimum:
        raise ConfigError(f"bench: {key}={value} must be >= {minimum}")
    return value


def _ints(opts: dict[str, str], key: str) -> list[int]:
    try:
        values = [int(v) for v in opts[key].strip("[]()").replace(" ", "").split(",") if v]
    except ValueError:
        raise ConfigError(f"bench: {key}={opts[key]!r} must be comma-separated integers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"bench: {key}={opts[key]!r} must list positive integers")
    return values


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"bench: device={name} requested but CUDA is not available; use device=cpu"
        )
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"bench: device={name!r} is not a device: use cpu, cuda or cuda:N"
        ) from None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_GEMM_CACHE: dict[tuple[str, torch.dtype], float] = {}


def gemm_gflops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Measured GFLOP/s of a square matmul (n = 2048 on CPU, 8192 on CUDA; best of 5) on `device`."""
    key = (str(device), dtype)
    if key not in _GEMM_CACHE:
        n = 8192 if device.type == "cuda" else 2048
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        reps = 20 if device.type == "cuda" else 1
        torch.mm(a, b)
        best = float("inf")
        for _ in range(5):  # best of 5: the peak the device reaches, not the noise of a shared host
            _sync(device)
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            _sync(device)
            best = min(best, (time.perf_counter() - start) / reps)
        _GEMM_CACHE[key] = 2 * n**3 / best / 1e9
    return _GEMM_CACHE[key]


def gemm_meter_gflops(
    device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int], reps: int = 3
) -> float:
    """Mean GFLOP/s of `reps` batched GEMMs `[E, M, K] @ [E, K, N]` (the update's own shape class),
    timed like the update (a mean, not a best-of), so a fraction against it is fair on a busy host."""
    e, m, k, n = shape
    a = torch.randn(e, m, k, device=device, dtype=dtype)
    b = torch.randn(e, k, n, device=device, dtype=dtype)
    torch.bmm(a, b)
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        torch.bmm(a, b)
    _sync(device)
    return 2 * e * m * k * n * reps / (time.perf_counter() - start) / 1e9


def _meter_shapes(opts: dict[str, str], family: str, batch: int) -> dict[str, tuple]:
    """`square`: the 2048² (CPU) / 8192² (CUDA) GEMM of gemm_gflops; `update`: the critic's
    largest forward GEMM at this batch (both members)."""
    members = 2
    if family.startswith("mlp"):
        dims = [
            _int(opts, "obs_dim") + _int(opts, "action_dim"),
            *_ints(opts, "critic.hidden_dims"),
        ]
        k, n = max(itertools.pairwise(dims), key=lambda d: d[0] * d[1])
    else:
        k, n = _int(opts, "critic.width"), 4 * _int(opts, "critic.width")
    return {"square": (1, 2048, 2048, 2048), "update": (members, batch, k, n)}


def filled_replay(
    num_envs: int,
    capacity: int,
    obs_dim: int,
    action_dim: int,
    device: torch.device,
    *,
    critic_obs_dim: int = 0,
    n_step: int = 1,
    seed: int = 0,
    **kwargs: Any,
) -> ReplayBuffer:
    """A ReplayBuffer filled to capacity with random steps (≈1 % terminations and truncations)."""
    rb = ReplayBuffer(
        num_envs,
        capacity,
        obs_dim,
        action_dim,
        critic_obs_dim=critic_obs_dim,
        device=device,
        n_step=n_step,
        **kwargs,
    )
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    for _ in range(capacity):
        ends = torch.rand(2, num_envs, generator=gen, device=device) < 0.01
        cobs = {}
        if critic_obs_dim:
            cobs = {"critic_obs": rand(num_envs, critic_obs_dim)}
            cobs["final_critic_obs"] = rand(num_envs, critic_obs_dim)
        rb.add(
            rand(num_envs, obs_dim),
            rand(num_envs, action_dim).clamp(-1, 1),
            rand(num_envs),
            ends[0],
            ends[1],
            final_obs=rand(num_envs, obs_dim),
            **cobs,
        )
    return rb


def count_update_flops(
    learner: OffPolicyLearner, batch: Any, policy_frequency: int
) -> tuple[float, float]:
    """GEMM FLOPs of one critic update and of one actor update (forward + backward), counted on
    a deep copy so that `learner` is not stepped."""
    probe = copy.deepcopy(learner)
    counts = []
    for fn in (probe.critic_update, probe.actor_step):
        with FlopCounterMode(display=False) as counter:
            fn(batch)
        counts.append(float(counter.get_total_flops()))
    return counts[0], counts[1]


IMPLS = ("fast", "reference")


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


@dataclass
class _Update:
    opts: dict[str, str]
    device: torch.device

    def learner(self, family: str) -> OffPolicyLearner:
        o = self.opts
        act = o["critic.activation"] or ("silu_layernorm" if o["algo"] == "fastsac" else "relu")
        critic = CriticConfig(
            family=family,
            hidden_dims=_ints(o, "critic.hidden_dims"),
            width=_int(o, "critic.width"),
            num_blocks=_int(o, "critic.num_blocks"),
            rank=_int(o, "critic.rank"),
            activation=act,
            lora_layers=["hidden"] if family == "mlp_lora" else ["blocks"],
        )
        actor = ActorConfig(hidden_dims=_ints(o, "actor.hidden_dims"), activation=act)
        algo = AlgoConfig(
            name=o["algo"],
            num_atoms=_int(o, "num_atoms", 2),
            batch_size=_int(o, "batch_size"),
            policy_frequency=_int(o, "policy_frequency"),
            n_step=_int(o, "n_step"),
        )
        obs, cobs = _int(o, "obs_dim"), _int(o, "critic_obs_dim", 0)
        torch.manual_seed(_int(o, "seed", 0))
        return make_learner(
            algo, critic, actor, obs, cobs or obs, _int(o, "action_dim"), self.device, amp=o["amp"]
        )


def _widths(opts: dict[str, str], family: str) -> dict[str, Any]:
    if family.startswith("mlp"):
        widths: dict[str, Any] = {"hidden_dims": _ints(opts, "critic.hidden_dims")}
    else:
        widths = {
            "width": _int(opts, "critic.width"),
            "num_blocks": _int(opts, "critic.num_blocks"),
        }
    if family.endswith("_lora"):
        widths["rank"] = _int(opts, "critic.rank")
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
    _sync(device)
    first = time.perf_counter() - start
    for _ in range(max(warmup, pf) - 1):
        one()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        one()
    _sync(device)
    return (time.perf_counter() - start) / iters, first


def bench_update(opts: dict[str, str], emit: Callable[[dict[str, Any]], None]) -> list[dict]:
    """Run `bench update` for every mode (and the dense twin of a LoRA family); emit each record."""
    device = _device(opts["device"])
    configure_backends(device)
    modes = [m for m in opts["modes"].split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ConfigError(f"bench: modes={opts['modes']!r}: use a comma list of {', '.join(MODES)}")
    if opts["algo"] not in ("fasttd3", "fastsac"):
        raise ConfigError(f"bench: algo={opts['algo']!r}: use fasttd3 or fastsac")
    batch, num_envs = _int(opts, "batch_size"), _int(opts, "num_envs")
    if batch % num_envs:
        raise ConfigError(
            f"bench: batch_size={batch} must be a multiple of num_envs={num_envs} "
            "(the batch is sampled evenly across environments)"
        )
    iters, warmup, pf = _int(opts, "iters"), _int(opts, "warmup", 0), _int(opts, "policy_frequency")
    obs, cobs, act = (
        _int(opts, "obs_dim"),
        _int(opts, "critic_obs_dim", 0),
        _int(opts, "action_dim"),
    )
    replay = filled_replay(
        num_envs,
        _int(opts, "buffer_size", _int(opts, "n_step") + 1),
        obs,
        act,
        device,
        critic_obs_dim=cobs,
        n_step=_int(opts, "n_step"),
    )
    family = opts["critic"]
    families = [family]
    if family in _DENSE_OF and opts["compare_dense"].lower() in ("1", "true", "yes"):
        families.insert(0, _DENSE_OF[family])
    dtype = torch.bfloat16 if opts["amp"] == "bf16" else torch.float32
    peak = gemm_gflops(device, dtype)
    rounds = _int(opts, "rounds")
    factory = _Update(opts, device)
    impls = [i for i in opts["impls"].split(",") if i]
    if not impls or any(i not in IMPLS for i in impls):
        raise ConfigError(f"bench: impls={opts['impls']!r}: use a comma list of {', '.join(IMPLS)}")
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
    shapes = _meter_shapes(opts, family, batch)
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
            "algo": opts["algo"],
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            "critic": fam,
            "mode": step.mode,
            "impl": impl,
            "batch_size": batch,
            "widths": _widths(opts, fam),
            "obs_dim": obs,
            "action_dim": act,
            "num_atoms": _int(opts, "num_atoms", 2),
            "amp": opts["amp"],
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


def bench_replay(opts: dict[str, str]) -> dict[str, Any]:
    """Bytes per transition (vs a buffer with explicit next_obs) and sample_nstep throughput."""
    device = _device(opts["device"])
    dtypes = {}
    for key in ("obs_dtype", "action_dtype"):
        if opts[key] not in _OBS_DTYPES:
            raise ConfigError(f"bench: {key}={opts[key]!r}: use one of {', '.join(_OBS_DTYPES)}")
        dtypes[key] = _OBS_DTYPES[opts[key]]
    num_envs, batch = _int(opts, "num_envs"), _int(opts, "batch_size")
    if batch % num_envs:
        raise ConfigError(
            f"bench: batch_size={batch} must be a multiple of num_envs={num_envs} "
            "(the batch is sampled evenly across environments)"
        )
    rb = filled_replay(
        num_envs,
        _int(opts, "buffer_size"),
        _int(opts, "obs_dim"),
        _int(opts, "action_dim"),
        device,
        critic_obs_dim=_int(opts, "critic_obs_dim", 0),
        n_step=_int(opts, "n_step"),
        max_episode_length=_int(opts, "max_episode_length"),
        **dtypes,
    )
    for _ in range(_int(opts, "warmup", 0)):
        rb.sample_nstep(batch)
    iters = _int(opts, "iters")
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        rb.sample_nstep(batch)
    _sync(device)
    sec = (time.perf_counter() - start) / iters
    bpt, ref = rb.bytes_per_transition, rb.reference_bytes_per_transition
    return {
        "name": "replay",
        "device": str(device),
        "obs_dim": rb.obs_dim,
        "critic_obs_dim": rb.critic_obs_dim,
        "action_dim": rb.action_dim,
        "obs_dtype": opts["obs_dtype"],
        "num_envs": num_envs,
        "buffer_size": rb.capacity,
        "n_step": rb.n_step,
        "bytes_per_transition": bpt,
        "reference_bytes_per_transition": ref,
        "ratio_to_reference": bpt / ref,
        "batch_size": batch,
        "samples_per_s": batch / sec,
        "ms_per_sample": 1e3 * sec,
    }


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def run_bench(args: list[str]) -> int:
    """Entry point of `fast-lora-td3 bench`: `update key=value…` or `replay key=value…`."""
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nupdate keys: {' '.join(f'{k}={v}' for k, v in UPDATE_DEFAULTS.items())}")
        print(f"modes: {', '.join(MODES)}")
        print(f"replay keys: {' '.join(f'{k}={v}' for k, v in REPLAY_DEFAULTS.items())}")
        return 0 if args else 2
    what, rest = args[0], args[1:]
    if what not in ("update", "replay"):
        raise ConfigError(
            f"bench: unknown benchmark {what!r}: use `bench update` or `bench replay`"
        )
    opts = parse_options(rest, UPDATE_DEFAULTS if what == "update" else REPLAY_DEFAULTS)
    if _int(opts, "threads", 0):
        torch.set_num_threads(_int(opts, "threads"))
    if what == "update":
        bench_update(opts, _emit)
    else:
        _emit(bench_replay(opts))
    sys.stdout.flush()
    return 0
