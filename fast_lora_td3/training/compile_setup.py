"""Process and optimiser settings that a compiled or CUDA-graph-captured update step needs.

Kept apart from `update_step` so that module reads as the update path itself; UpdateStep calls
these when it builds a mode.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["configure_backends", "configure_compiler", "make_capturable_", "tensor_lrs_"]


def configure_backends(device: torch.device | str) -> None:
    """TF32 matmuls / convolutions on CUDA (the recipe's speed setting; its losses tolerate the
    10-bit mantissa); nothing on CPU."""
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
