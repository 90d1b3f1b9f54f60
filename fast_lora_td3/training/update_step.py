"""The update step as the trainer calls it: eager, torch.compile'd, or captured in CUDA graphs.

The one update path: `UpdateStep(learner, UpdateStepConfig(...))(batch)` runs a critic update and,
every `policy_frequency`-th call, an actor update, and counts the updates (checkpointed).

Modes (from the config's `compile`, `cuda_graph` and `graph_impl`):

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
import dataclasses
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.config.schema import parse_flag
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.training.compile_setup import (
    configure_backends,
    configure_compiler,
    make_capturable_,
    tensor_lrs_,
)
from fast_lora_td3.training.update_mode import ModeFlags, mode_candidates, select_mode

if TYPE_CHECKING:
    from fast_lora_td3.config.schema import TrainConfig

__all__ = ["GRAPH_IMPLS", "UpdateStep", "UpdateStepConfig", "verify_compile"]

GRAPH_IMPLS = ("manual", "reduce_overhead")
Flag = Literal["auto", "true", "false"]
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


@dataclass(frozen=True)
class UpdateStepConfig:
    """How UpdateStep runs a learner's update, and when the actor updates.

    The defaults run eager, with an actor update after every critic update: what a bare UpdateStep
    (tests, benchmarks) needs. Training builds it from its TrainConfig (`from_train_config`).
    """

    compile: Flag | bool = "false"
    """torch.compile the critic and actor steps: `auto`, `true` or `false` (a bool is taken too and
    stored as `true` / `false`). `auto` picks the fastest mode that passes the parity check."""
    cuda_graph: Flag | bool = "false"
    """Capture each step in a CUDA graph: `auto`, `true` (CUDA only; a note elsewhere) or `false`."""
    graph_impl: Literal["manual", "reduce_overhead"] = "manual"
    """With cuda_graph: `manual` (our torch.cuda.CUDAGraph capture) or `reduce_overhead`
    (torch.compile's cudagraph trees)."""
    compile_backend: str = "inductor"
    """torch.compile backend (`aot_eager` traces without generating code: fast tests)."""
    policy_frequency: int = 1
    """One actor update every `policy_frequency` critic updates (counted over the whole run)."""
    warmup: int = 3
    """Updates run (then undone) before a manual CUDA-graph capture: lazy state, workspaces."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compile", parse_flag("compile", self.compile))
        object.__setattr__(self, "cuda_graph", parse_flag("cuda_graph", self.cuda_graph))
        if self.graph_impl not in GRAPH_IMPLS:
            raise ConfigError(
                f"graph_impl={self.graph_impl!r} is not valid: use one of {GRAPH_IMPLS}"
            )
        if self.policy_frequency < 1:
            raise ConfigError(
                f"policy_frequency={self.policy_frequency} is not valid: use an integer >= 1"
            )

    @classmethod
    def from_train_config(cls, cfg: TrainConfig) -> UpdateStepConfig:
        """The update step of a training run: its compile / cuda_graph choice and the algorithm's
        policy_frequency (graph_impl, backend and warm-up keep their defaults)."""
        return cls(
            compile=cfg.compile,
            cuda_graph=cfg.cuda_graph,
            policy_frequency=cfg.algo.policy_frequency,
        )


class UpdateStep:
    """Callable `batch -> metrics`: a critic update, then an actor update on every
    `policy_frequency`-th call.

    The update counter lives here, on the host (never inside the compiled / captured functions);
    `state_dict` / `load_state_dict` checkpoint it so a resumed run keeps the actor schedule.
    """

    def __init__(self, learner: OffPolicyLearner, config: UpdateStepConfig | None = None) -> None:
        self.learner = learner
        self.config = config or UpdateStepConfig()
        self.device = learner.device
        self.num_critic_updates = 0
        c, g = self.config.compile, self.config.cuda_graph
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
        flags = dataclasses.replace(self.config, compile=mode.compile, cuda_graph=mode.cuda_graph)
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
    def flags(self) -> UpdateStepConfig:
        """The config with the resolved mode (no `auto` left): what verify_compile re-runs."""
        return dataclasses.replace(
            self.config,
            compile=self.compiled and self.mode != "reduce_overhead",
            cuda_graph=self.graph_impl is not None,
        )

    def _build(self, want_compile: bool, want_graph: bool) -> None:
        learner, impl, backend = self.learner, self.config.graph_impl, self.config.compile_backend
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
            for opt in learner.optimizers().values():
                tensor_lrs_(opt, self.device)
        self._critic_fn, self._actor_fn = critic_fn, actor_fn
        self._static: Any = None
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, dict[str, Tensor]]] = {}

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> dict[str, Tensor]:
        """One critic update, then an actor update if this is a `policy_frequency`-th update."""
        do_actor = (self.num_critic_updates + 1) % self.config.policy_frequency == 0
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
        self.num_critic_updates += 1
        return metrics

    def state_dict(self) -> dict[str, int]:
        """The update count, under the key it has in every checkpoint's learner state."""
        return {"num_critic_updates": self.num_critic_updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of state_dict (extra keys, e.g. a whole learner state, are ignored)."""
        self.num_critic_updates = int(state["num_critic_updates"])

    # -- manual CUDA graphs --------------------------------------------------------------------
    def _make_capturable(self) -> None:
        for opt in self.learner.optimizers().values():
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
        self._static = _clone_batch(batch)
        saved = {name: t.detach().clone() for name, t in self.learner.state_tensors()}
        rng_cpu, rng_cuda = torch.get_rng_state(), torch.cuda.get_rng_state(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), warnings.catch_warnings():
            # capturable=True warns when stepped outside a capture: expected during warm-up.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(self.config.warmup):
                self._critic_fn(self._static)
                self._actor_fn(self._static)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for key, fn in (("critic", self._critic_fn), ("actor", self._actor_fn)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(self._static)
            self._graphs[key] = (graph, out)
        with torch.no_grad():
            for name, t in self.learner.state_tensors():
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
# tf32 (fp32 on CUDA with TF32 matmuls): one H200 measured update errors of 0.001-0.059 over 24
# checks (docs/results/gpu/device_check_fp32_h200.jsonl); 0.05 refused a correct FastSAC step.
_TOLERANCES = {"fp32": (1e-3, 1e-4, 0.05), "tf32": (1e-3, 1e-4, 0.15), "bf16": (3e-2, 1e-2, 0.3)}


def tolerance_precision(amp: bool, device: torch.device) -> str:
    """The `_TOLERANCES` row of an update: bf16 autocast, TF32 matmuls on CUDA, or plain fp32."""
    if amp:
        return "bf16"
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return "tf32" if tf32 else "fp32"


def verify_compile(
    learner: OffPolicyLearner,
    batch_fn: Callable[[], Any],
    config: UpdateStepConfig,
    steps: int = 3,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    update_rtol: float | None = None,
) -> dict[str, Any]:
    """Run `steps` updates eagerly and through `UpdateStep(·, config)` from deep copies of `learner`
    (same batches from `batch_fn`, same RNG seed) and compare them; `learner` is left untouched and
    the caller's RNG streams are not advanced. Both sides update the actor every second update
    (on the only update when steps=1), whatever `config.policy_frequency` says.

    Passes when every metric agrees within `atol + rtol·|eager|` and, for every parameter / buffer
    that eager moved, ‖compiled − eager‖ ≤ update_rtol·‖eager − start‖ (Adam turns rounding-level
    gradient differences into lr-sized steps on near-zero gradients, so an absolute parameter
    tolerance would be either blind or flaky; a broken compile moves the whole update). Raises
    RuntimeError naming the largest violation and its tolerance. Returns the measured errors.
    Unset tolerances come from `_TOLERANCES` for the update's precision (`tolerance_precision`).
    """
    d_rtol, d_atol, d_urtol = _TOLERANCES[
        tolerance_precision(learner.amp_dtype is not None, learner.device)
    ]
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
        start = {n: t.detach().clone() for n, t in learner.state_tensors()}
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        runs = []
        schedule = 1 if steps == 1 else 2  # exercise the actor step, and a critic-only step
        test_step = UpdateStep(test, dataclasses.replace(config, policy_frequency=schedule))
        if test_step.mode == "eager":
            return {"verified": False, "mode": "eager", "reason": "nothing compiled or captured"}
        for copy_, step in (
            (ref, UpdateStep(ref, UpdateStepConfig(policy_frequency=schedule))),
            (test, test_step),
        ):
            torch.manual_seed(seed)
            history = []
            for batch in batches:
                history.append({k: float(v) for k, v in step(batch).items()})
            runs.append((history, dict(copy_.state_tensors())))
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
