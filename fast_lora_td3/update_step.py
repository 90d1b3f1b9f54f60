"""The update step as the trainer calls it: eager, torch.compile'd, or captured in CUDA graphs (SPEC §5).

Modes (from the flags `compile`, `cuda_graph` and `graph_impl`):

* `eager`: `learner.critic_update` / `learner.actor_step` as written.
* `compiled`: the same two functions under `torch.compile` (inductor; graph breaks at `backward`).
* `graphed`: each of the two steps (forward, backward, optimiser step, projection, Polyak) captured
  in one `torch.cuda.CUDAGraph` over the eager or compiled function; the replay sample is copied into
  static input buffers and the graphs are replayed. CUDA only; CPU falls back with a one-line note.
* `reduce_overhead`: `torch.compile(mode="reduce-overhead")` (cudagraph trees) instead of the manual
  capture. `scripts/device_check.py` measures which of the two is faster.

No step reads a tensor on the host, so metrics come back as 0-d device tensors. In graphed modes they
are static output buffers, overwritten by the next call: consume (sum, clone) them before that.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.update_mode import ModeFlags, mode_candidates, parse_flag, select_mode

__all__ = [
    "GRAPH_IMPLS",
    "UpdateStep",
    "all_optimizers",
    "configure_backends",
    "learner_tensors",
    "tensor_lrs_",
    "verify_compile",
]

GRAPH_IMPLS = ("manual", "reduce_overhead")
# Tensors of a replay sample that the losses read (ReplaySample or any object with these fields).
BATCH_FIELDS = (
    "obs",
    "critic_obs",
    "actions",
    "rewards",
    "next_obs",
    "next_critic_obs",
    "bootstrap",
    "discount",
)


def configure_backends(device: torch.device | str) -> None:
    """TF32 matmuls / convolutions on CUDA (SPEC §2.1); nothing on CPU."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def configure_compiler() -> None:
    """Dynamo / inductor settings every compiled update needs.

    One learner's step functions share code objects with every other learner built in the process
    (verify_compile's copies, benchmarks, tests), so the default recompile limit (8) would silently
    fall back to eager; `fallback_random` makes compiled RNG draw the same numbers as eager, which
    keeps the parity check meaningful.
    """
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
    if hasattr(dynamo_config, "recompile_limit"):
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, 1024
        )
    inductor_config.fallback_random = True


def all_optimizers(learner: OffPolicyLearner) -> list[torch.optim.Optimizer]:
    """Every optimiser the update steps (FastSAC's α optimiser included)."""
    opts = list(learner.optimizers().values())
    alpha_opt = getattr(learner, "alpha_optimizer", None)
    if alpha_opt is not None:
        opts.append(alpha_opt)
    return opts


def learner_tensors(learner: OffPolicyLearner) -> Iterator[tuple[str, Tensor]]:
    """Every tensor an update may change: module parameters and buffers, log α, optimiser state."""
    for mod_name, module in learner.modules().items():
        for name, t in module.state_dict(keep_vars=True).items():
            if isinstance(t, Tensor):
                yield f"{mod_name}.{name}", t
    log_alpha = getattr(learner, "log_alpha", None)
    if isinstance(log_alpha, Tensor):
        yield "log_alpha", log_alpha
    for i, opt in enumerate(all_optimizers(learner)):
        for j, state in enumerate(opt.state.values()):
            for key, t in state.items():
                if isinstance(t, Tensor):
                    yield f"optimizer{i}.{j}.{key}", t


def make_capturable_(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Switch an Adam(W) to `capturable=True` with a tensor LR, so its step can live in a CUDA graph
    and an LR scheduler (which `fill_`s tensor LRs in place) still reaches the captured kernels."""
    opt.defaults["capturable"] = True
    for group in opt.param_groups:
        group["capturable"] = True
        if not isinstance(group["lr"], Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
    for state in opt.state.values():
        step = state.get("step")
        if isinstance(step, Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)


def tensor_lrs_(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Make every LR of `opt` a 0-d tensor on `device` (schedulers then `fill_` it in place).

    A Python-float LR is a constant to dynamo: every scheduler step would recompile the optimiser
    step (issue 10). Fused AdamW and capturable Adam(W) take tensor LRs; a `foreach` one does not,
    so it becomes capturable on CUDA and single-tensor elsewhere.
    """
    if device.type == "cuda" and not all(g.get("fused") for g in opt.param_groups):
        make_capturable_(opt, device)
        return
    for group in opt.param_groups:
        if not group.get("fused"):
            group["foreach"] = False
        if not isinstance(group["lr"], Tensor):
            # float64 on the CPU: the fused kernel then steps exactly as with a Python-float LR
            dtype = torch.float64 if device.type == "cpu" else torch.float32
            group["lr"] = torch.tensor(float(group["lr"]), device=device, dtype=dtype)


class UpdateStep:
    """Callable `(batch, do_actor) -> metrics` around a learner's critic and actor steps.

    `cfg` supplies `compile`, `cuda_graph` (and optionally `graph_impl`, "manual" or
    "reduce_overhead"); keyword arguments override it. The learner's update counter is kept here
    (on the host), never inside the compiled / captured functions.
    """

    def __init__(
        self,
        learner: OffPolicyLearner,
        cfg: Any = None,
        *,
        compile: bool | str | None = None,
        cuda_graph: bool | str | None = None,
        graph_impl: str | None = None,
        warmup: int = 3,
        backend: str | None = None,
    ) -> None:
        self.learner = learner
        self.backend = backend or getattr(cfg, "compile_backend", None) or "inductor"
        self.device = learner.device
        c = parse_flag("compile", getattr(cfg, "compile", False) if compile is None else compile)
        g = parse_flag(
            "cuda_graph", getattr(cfg, "cuda_graph", False) if cuda_graph is None else cuda_graph
        )
        impl = graph_impl or getattr(cfg, "graph_impl", None) or "manual"
        if impl not in GRAPH_IMPLS:
            raise ConfigError(f"graph_impl={impl!r} is not valid: use one of {GRAPH_IMPLS}")
        self.graph_impl_requested = impl
        self.warmup = warmup
        configure_backends(self.device)
        self.verified = False  # set when an `auto` selection ran the parity check on this mode
        self._pending: tuple[list[ModeFlags], str] | None = None
        self.selection = ""
        self._first_batch: Any = None
        if "auto" not in (c, g):
            self._build(c == "true", g == "true")
            return
        candidates, why = mode_candidates(c, g, self.device, learner.grad_sync is None)
        if len(candidates) == 1:
            self._build(candidates[0].compile, candidates[0].cuda_graph)
            self._report(select_mode(candidates, self._verify_mode, why, auto=True)[1])
        else:  # the parity check needs a real batch: choose at the first call
            self._pending = (candidates, why)
            self.mode = "pending"
            self.compiled = False

    def _report(self, line: str) -> None:
        self.selection = line
        print(line, file=sys.stderr, flush=True)  # stderr: bench / device_check stdout is JSON

    def _verify_mode(self, mode: ModeFlags) -> dict[str, Any]:
        assert self._first_batch is not None
        flags = SimpleNamespace(
            compile=mode.compile,
            cuda_graph=mode.cuda_graph,
            graph_impl=self.graph_impl_requested,
            compile_backend=self.backend,
        )
        return verify_compile(self.learner, lambda: self._first_batch, flags)

    def _select(self, batch: Any) -> None:
        """Run the `auto` chain on copies of the learner with this batch, then build the mode."""
        assert self._pending is not None
        candidates, why = self._pending
        self._first_batch = _clone_batch(batch)
        try:
            mode, line = select_mode(candidates, self._verify_mode, why, auto=True)
        finally:
            self._first_batch = None
        self._pending = None
        self._build(mode.compile, mode.cuda_graph)
        self.verified = mode.name != "eager"
        self._report(line)

    @property
    def flags(self) -> SimpleNamespace:
        """The resolved flags (for verify_compile): compile, cuda_graph, graph_impl, backend."""
        return SimpleNamespace(
            compile=self.compiled and self.mode != "reduce_overhead",
            cuda_graph=self.graph_impl is not None,
            graph_impl=self.graph_impl_requested,
            compile_backend=self.backend,
        )

    def _build(self, want_compile: bool, want_graph: bool) -> None:
        learner, impl, backend = self.learner, self.graph_impl_requested, self.backend
        if want_compile and not torch._dynamo.is_dynamo_supported():
            _note("compile=true: torch.compile is not supported here; running eager")
            want_compile = False
        if want_graph and self.device.type != "cuda":
            _note(f"cuda_graph=true needs a CUDA device (have {self.device}); not capturing")
            want_graph = False
        if want_graph and learner.grad_sync is not None:
            _note("cuda_graph=true with data-parallel gradient sync: not capturing")
            want_graph = False
        self.graph_impl = impl if want_graph else None
        critic_fn: Callable[[Any], dict[str, Tensor]] = learner.critic_update
        actor_fn: Callable[[Any], dict[str, Tensor]] = learner.actor_step
        if want_graph and impl == "reduce_overhead":
            configure_compiler()
            self._make_capturable()
            critic_fn = torch.compile(critic_fn, mode="reduce-overhead", dynamic=False)
            actor_fn = torch.compile(actor_fn, mode="reduce-overhead", dynamic=False)
            self.mode = "reduce_overhead"
        elif want_compile:
            configure_compiler()
            # Static shapes: training batches never change size, and dynamic-shape tracing of the
            # samplers is fragile (a recompile on a second batch size made dims symbolic).
            critic_fn = torch.compile(critic_fn, backend=backend, dynamic=False)
            actor_fn = torch.compile(actor_fn, backend=backend, dynamic=False)
            self.mode = "graphed" if want_graph else "compiled"
        else:
            self.mode = "graphed" if want_graph else "eager"
        self.compiled = want_compile or self.mode == "reduce_overhead"
        if self.compiled:
            for opt in all_optimizers(learner):
                tensor_lrs_(opt, self.device)
        self._critic_fn, self._actor_fn = critic_fn, actor_fn
        self._static: Any = None
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, dict[str, Tensor]]] = {}

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, batch: Any, do_actor: bool) -> dict[str, Tensor]:
        """One critic update, then an actor update when `do_actor` (a host-side schedule)."""
        if self._pending is not None:
            self._select(batch)
        if self.mode == "graphed":
            metrics = self._graphed(batch, do_actor)
        else:
            if self.mode == "reduce_overhead":
                torch.compiler.cudagraph_mark_step_begin()
            metrics = dict(self._critic_fn(batch))
            if do_actor:
                metrics.update(self._actor_fn(batch))
        self.learner.num_critic_updates += 1
        return metrics

    # -- manual CUDA graphs --------------------------------------------------------------------
    def _make_capturable(self) -> None:
        for opt in all_optimizers(self.learner):
            make_capturable_(opt, self.device)
        self.learner.autocast_cache = False

    def _graphed(self, batch: Any, do_actor: bool) -> dict[str, Tensor]:
        if self._static is None:
            self._capture(batch)
        for name in BATCH_FIELDS:
            getattr(self._static, name).copy_(getattr(batch, name), non_blocking=True)
        graph, out = self._graphs["critic"]
        graph.replay()
        metrics = dict(out)
        if do_actor:
            graph, out = self._graphs["actor"]
            graph.replay()
            metrics.update(out)
        return metrics

    def _capture(self, batch: Any) -> None:
        """Warm up on a side stream (lazy optimiser state, cuBLAS workspaces, compilation), capture
        both steps, then restore every learner tensor and the RNG to their pre-warm-up values, so the
        warm-up updates leave no trace (new optimiser state restarts at zero, as a fresh Adam would)."""
        self._make_capturable()
        self._static = _StaticBatch({n: getattr(batch, n).detach().clone() for n in BATCH_FIELDS})
        saved = {name: t.detach().clone() for name, t in learner_tensors(self.learner)}
        rng_cpu, rng_cuda = torch.get_rng_state(), torch.cuda.get_rng_state(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), warnings.catch_warnings():
            # capturable=True warns when stepped outside a capture: expected during warm-up.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(self.warmup):
                self._critic_fn(self._static)
                self._actor_fn(self._static)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for key, fn in (("critic", self._critic_fn), ("actor", self._actor_fn)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(self._static)
            self._graphs[key] = (graph, out)
        with torch.no_grad():
            for name, t in learner_tensors(self.learner):
                if name in saved:
                    t.copy_(saved[name])
                else:
                    t.zero_()
        torch.set_rng_state(rng_cpu)
        torch.cuda.set_rng_state(rng_cuda, self.device)


class _StaticBatch:
    """Static input buffers with the attribute names of a ReplaySample."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.__dict__.update(tensors)


def _note(message: str) -> None:
    """One-line note on stderr (not an error: the step still runs)."""
    print(f"[fast_lora_td3] note: {message}", file=sys.stderr)


# Default tolerances of verify_compile: (metric rtol, metric atol, relative parameter-update error).
_TOLERANCES = {"fp32": (1e-3, 1e-4, 0.05), "bf16": (3e-2, 1e-2, 0.3)}


def verify_compile(
    learner: OffPolicyLearner,
    batch_fn: Callable[[], Any],
    cfg: Any,
    steps: int = 3,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    update_rtol: float | None = None,
) -> dict[str, Any]:
    """Run `steps` updates eagerly and through `UpdateStep(·, cfg)` from deep copies of `learner`
    (same batches from `batch_fn`, same RNG seed) and compare them; `learner` is left untouched and
    the caller's RNG streams are not advanced.

    Passes when every metric agrees within `atol + rtol·|eager|` and, for every parameter / buffer
    that eager moved, ‖compiled − eager‖ ≤ update_rtol·‖eager − start‖ (Adam turns rounding-level
    gradient differences into lr-sized steps on near-zero gradients, so an absolute parameter
    tolerance would be either blind or flaky; a broken compile moves the whole update). Raises
    RuntimeError naming the largest violation and its tolerance. Returns the measured errors.
    """
    fp = "bf16" if learner.amp_dtype is not None else "fp32"
    d_rtol, d_atol, d_urtol = _TOLERANCES[fp]
    rtol, atol = d_rtol if rtol is None else rtol, d_atol if atol is None else atol
    update_rtol = d_urtol if update_rtol is None else update_rtol
    if steps < 1:
        raise ConfigError(f"verify_compile steps={steps} must be >= 1")
    devices = [learner.device] if learner.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        batches = [_clone_batch(batch_fn()) for _ in range(steps)]
        sync, learner.grad_sync = learner.grad_sync, None  # copies run locally, without all-reduce
        try:
            ref, test = copy.deepcopy(learner), copy.deepcopy(learner)
        finally:
            learner.grad_sync = sync
        start = {n: t.detach().clone() for n, t in learner_tensors(learner)}
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        runs = []
        test_step = UpdateStep(test, cfg)
        if test_step.mode == "eager":
            return {"verified": False, "mode": "eager", "reason": "nothing compiled or captured"}
        for copy_, step in (
            (ref, UpdateStep(ref, compile=False, cuda_graph=False)),
            (test, test_step),
        ):
            torch.manual_seed(seed)
            history = []
            for i, batch in enumerate(batches):
                out = step(batch, do_actor=(i % 2 == 1) or steps == 1)
                history.append({k: float(v) for k, v in out.items()})
            runs.append((history, dict(learner_tensors(copy_))))
    (eager_hist, eager_t), (test_hist, test_t) = runs
    worst_m = (0.0, 0.0, "", 0)  # (excess, |diff|, key, step)
    for i, (me, mt) in enumerate(zip(eager_hist, test_hist, strict=True)):
        for key, ve in me.items():
            diff = abs(mt[key] - ve)
            excess = diff - (atol + rtol * abs(ve))
            if diff != diff or excess > worst_m[0] or (worst_m[2] == "" and diff > worst_m[1]):
                worst_m = (float("inf") if diff != diff else excess, diff, key, i)
    worst_u = (0.0, "")
    max_abs = 0.0
    for name, te in eager_t.items():
        if name.startswith("optimizer") or not te.is_floating_point() or name not in start:
            continue
        diff = (test_t[name].float() - te.float()).norm().item()
        moved = (te.float() - start[name].float()).norm().item()
        max_abs = max(max_abs, (test_t[name].float() - te.float()).abs().max().item())
        rel = diff / moved if moved > 0 else (0.0 if diff <= atol else float("inf"))
        if rel != rel or rel > worst_u[0]:
            worst_u = (float("inf") if rel != rel else rel, name)
    result = {
        "verified": True,
        "mode": test_step.mode,
        "steps": steps,
        "max_metric_diff": worst_m[1],
        "metric_tolerance": {"rtol": rtol, "atol": atol},
        "max_param_abs_diff": max_abs,
        "max_update_rel_err": worst_u[0],
        "update_rtol": update_rtol,
    }
    if worst_m[0] > 0:
        raise RuntimeError(
            f"verify_compile: {result['mode']} update differs from eager: |Δ {worst_m[2]}| = "
            f"{worst_m[1]:.3g} at update {worst_m[3]} > atol {atol:g} + rtol {rtol:g}·|eager|; "
            "refusing to train (set compile=false cuda_graph=false)"
        )
    if worst_u[0] > update_rtol:
        raise RuntimeError(
            f"verify_compile: {result['mode']} update differs from eager: ‖Δ {worst_u[1]}‖ = "
            f"{worst_u[0]:.3g} × its eager update > tolerance {update_rtol:g}; refusing to train "
            "(set compile=false cuda_graph=false)"
        )
    return result


def _clone_batch(batch: Any) -> _StaticBatch:
    """A private copy of the loss inputs of one sample (the sampler may reuse its buffers)."""
    return _StaticBatch({n: getattr(batch, n).detach().clone() for n in BATCH_FIELDS})
