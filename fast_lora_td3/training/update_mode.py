"""Which update mode a run uses: `compile` / `cuda_graph` are `auto`, `true` or `false` (issue 10).

`auto` takes the fastest mode that passes the start-up parity check against eager
(`verify_compile`): on CUDA graphed (CUDA graph over the compiled step), then compiled, then eager.
An explicit `false` removes the modes that need it, an explicit `true` keeps only those. On other
devices `auto` means eager: CUDA graphs need CUDA, and compiling the step on a CPU costs about a
minute of compilation per run for the small CPU recipes (set `compile=true` to compile anyway).
One line (`update step: …`) says which mode was chosen and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fast_lora_td3.config.schema import parse_flag

__all__ = ["FLAG_VALUES", "ModeFlags", "mode_candidates", "select_mode"]

FLAG_VALUES = ("auto", "true", "false")


@dataclass(frozen=True)
class ModeFlags:
    """The UpdateStep flags of one candidate mode."""

    compile: bool
    cuda_graph: bool

    @property
    def name(self) -> str:
        """The mode's name as UpdateStep and `bench update` report it."""
        if self.cuda_graph:
            return "graphed" if self.compile else "graphed_eager"
        return "compiled" if self.compile else "eager"


def mode_candidates(
    compile: Any, cuda_graph: Any, device: torch.device, can_graph: bool = True
) -> tuple[list[ModeFlags], str]:
    """Candidate modes, fastest first, and the reason for the list (for the one-line report).

    `can_graph` is false when graphs are impossible whatever the device (data-parallel gradient
    sync). The caller verifies the candidates in order when any flag is `auto`.
    """
    c, g = parse_flag("compile", compile), parse_flag("cuda_graph", cuda_graph)
    if device.type != "cuda":
        why = f"on {device.type}"
        if g == "true":
            why += " (cuda_graph=true needs CUDA: not capturing)"
        if c == "auto":
            why += ": compile=auto means eager here (set compile=true to compile)"
            return [ModeFlags(False, False)], why
        return [ModeFlags(c == "true", False)], why
    if not can_graph and g != "false":
        g = "false"
    if not torch._dynamo.is_dynamo_supported() and c != "false":
        c = "false"
    graphs = [True, False] if g == "auto" else [g == "true"]
    compiles = [True, False] if c == "auto" else [c == "true"]
    order = [ModeFlags(True, True), ModeFlags(True, False), ModeFlags(False, True)]
    order.append(ModeFlags(False, False))
    if c == "false" and g == "auto":
        order = [ModeFlags(False, True), ModeFlags(False, False)]
    out = [m for m in order if m.compile in compiles and m.cuda_graph in graphs]
    if c == "auto" and g == "auto":
        out = [m for m in out if m.name != "graphed_eager"]  # graphed → compiled → eager
    why = f"on {device.type} with compile={c} cuda_graph={g}"
    if not can_graph:
        why += " (no CUDA graphs with data-parallel gradient sync)"
    return out, why


def select_mode(
    candidates: list[ModeFlags],
    verify: Callable[[ModeFlags], dict[str, Any]],
    why: str,
    auto: bool,
) -> tuple[ModeFlags, str]:
    """The first candidate whose `verify` passes (eager needs no check), with the one-line report.

    Without `auto` (every flag explicit) the single candidate is taken unverified (the separate
    `verify_compile=true` still checks it). A candidate fails when `verify` raises (parity
    mismatch, compile or capture error); when none is left, RuntimeError names every failure.
    """
    if not auto or len(candidates) == 1:
        chosen = candidates[0]
        return chosen, f"update step: {chosen.name} ({why})"
    failures = []
    for mode in candidates:
        if mode.name == "eager":
            lost = "; ".join(failures) or "no faster mode was a candidate"
            return mode, f"update step: eager ({why}; {lost})"
        try:
            report = verify(mode)
        except Exception as exc:  # any failure of the fast path means: take the next one
            failures.append(f"{mode.name} failed: {_one_line(exc)}")
            continue
        err = report.get("max_update_rel_err", 0.0)
        passed = f"passed the parity check vs eager (update rel. err {err:.2g})"
        lost = "".join(f"; {f}" for f in failures)
        return mode, f"update step: {mode.name} ({why}; {passed}{lost})"
    raise RuntimeError(
        "no update mode passed the parity check and eager is excluded: " + "; ".join(failures)
    )


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
