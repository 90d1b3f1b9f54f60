"""The LoRALinear forward with a low-rank backward (LoRA within 5 % of dense cost, issue 10).

Forward: one GEMM with the merged weight `W = rownorm(W0 + s·(A B)ᵀ)` (`s = α/r`; rownorm scales
the rows chosen by `weight_norm` to unit length), exactly as `LoRALinear.effective_weight()`.
Backward: autograd through the merged weight would form the full `dW = dyᵀx` (a batch GEMM as
large as the forward) and only then reduce it to the adapters. `W0` is frozen, so the adapter
gradients are taken on the low-rank path instead:

    dW_raw = diag(g)·dyᵀx + diag(e)·W     (never formed)
    dB = s·[(x A)ᵀ (dy ⊙ g) + (W A)ᵀ diag(e)]
    dA = s·[xᵀ ((dy ⊙ g) Bᵀ) + Wᵀ (diag(e) Bᵀ)]

with `g_j = 1/‖w_raw_j‖` on normalised rows (1 elsewhere) and, from the derivative of the row
normalisation, `e_j = −g_j·Σ_b dy_bj (x Wᵀ)_bj` on normalised rows (0 elsewhere). At width 512,
rank 96 this is about 2·B·r·(in + out) FLOPs instead of 2·B·in·out; the `e` terms (two `r·in·out`
GEMMs) are only computed when rows can be normalised (`weight_norm` forward / project).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.nn.layers import ensemble_linear

__all__ = ["lora_linear", "none_flagged"]

_EPS = 1e-8  # l2_normalize's eps: rows shorter than this are divided by eps (no normal term)
NORM_MODES = ("none", "forward", "project")


def none_flagged(rows: Tensor | None) -> bool:
    """True when `rows` is a CPU tensor with no row flagged, outside torch.compile.

    On the CPU reading a tensor is a memory read, not a device synchronisation, so eager CPU code
    may skip the all-zero LoRA-WN fallback work (exactly: no row is normalised). On CUDA and while
    compiling the code stays branch-free and always returns False.
    """
    return (
        rows is not None
        and rows.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not bool(rows.any())
    )


def _merge(base: Tensor, a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """`W0 + s·Bᵀ Aᵀ` (`[.., out, in]`), as LoRALinear.effective_weight computes it."""
    b_t, a_t = b.transpose(-1, -2), a.transpose(-1, -2)
    if base.dim() == 2:
        return torch.addmm(base, b_t, a_t, alpha=scaling)
    return torch.baddbmm(base, b_t, a_t, alpha=scaling)


class _LoRALinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        base: Tensor,
        a: Tensor,
        b: Tensor,
        bias: Tensor | None,
        rows: Tensor | None,
        scaling: float,
        mode: str,
    ) -> Tensor:
        raw = _merge(base, a, b, scaling)
        if mode == "project" and none_flagged(rows):
            mode = "none"  # no row is normalised: the plain merged weight, no normal terms
        if mode == "none":
            w, g, normed = raw, None, None
        else:
            norm = torch.linalg.vector_norm(raw, dim=-1, keepdim=True)
            # Rows divided by their own norm (not by eps) carry the normal-direction gradient term.
            normed = norm > _EPS
            denom = norm.clamp_min(_EPS)
            if mode == "project":
                assert rows is not None
                picked = rows.unsqueeze(-1)
                normed = normed & picked
                # one division pass; x / 1 is exact, so unpicked rows stay as they are
                denom = torch.where(picked, denom, torch.ones_like(denom))
            w = raw / denom  # the same rounding as l2_normalize (F.normalize divides)
            g = 1.0 / denom
        y = ensemble_linear(x, w, bias)
        ctx.scaling, ctx.mode, ctx.x_dim = scaling, mode, x.dim()
        ctx.has_bias = bias is not None
        ctx.autocast = torch.is_autocast_enabled(x.device.type)
        ctx.autocast_dtype = torch.get_autocast_dtype(x.device.type)
        ctx.device_type = x.device.type
        if mode == "none":
            ctx.save_for_backward(x, a, b, w)
        else:
            ctx.save_for_backward(x, a, b, w, g, normed, y, bias)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        with torch.autocast(ctx.device_type, ctx.autocast_dtype, enabled=ctx.autocast):
            return _LoRALinearFn._backward(ctx, dy)

    @staticmethod
    def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, a, b, w, *norm = ctx.saved_tensors
        s, stacked = ctx.scaling, w.dim() == 3
        need_x, _, need_a, need_b, need_bias = ctx.needs_input_grad[:5]
        dx = da = db = dbias = None
        if need_x:
            dx = torch.matmul(dy, w)  # [.., B, in]
            if stacked and ctx.x_dim == 2:
                dx = dx.sum(0)  # the batch was broadcast to every member
        if need_bias and ctx.has_bias:
            dbias = dy.sum(-2, keepdim=True) if stacked else dy.reshape(-1, dy.shape[-1]).sum(0)
        if not (need_a or need_b):
            return dx, None, None, None, dbias, None, None, None
        if stacked and x.dim() == 2:
            x = x.unsqueeze(0).expand(w.shape[0], -1, -1)
        if not stacked:  # fold any leading axes into the batch: [N, in], [N, out]
            x, dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        e = None
        if ctx.mode != "none":
            g, normed, y, bias = norm
            if not stacked:
                y = y.reshape(-1, y.shape[-1])
            t = (dy * y).sum(-2)  # Σ_b dy_bj z_bj with z = x Wᵀ = y − bias: [.., out]
            if bias is not None:
                t = t - bias.reshape((*t.shape[:-1], -1)) * dy.sum(-2)
            g_row = g.squeeze(-1)
            e = torch.where(normed.squeeze(-1), -g_row * t, torch.zeros_like(t))
            dy = dy * g_row.unsqueeze(-2)
        xa = torch.matmul(x, a)  # [.., B, r]
        xa_t = xa.transpose(-1, -2)
        if need_b:
            db = s * torch.matmul(xa_t, dy)  # [.., r, out]
        if need_a:
            da = s * torch.matmul(x.transpose(-1, -2), torch.matmul(dy, b.transpose(-1, -2)))
        if e is not None:
            if need_b:
                db = db + s * (torch.matmul(w, a).transpose(-1, -2) * e.unsqueeze(-2))
            if need_a:
                da = da + s * torch.matmul(
                    w.transpose(-1, -2), b.transpose(-1, -2) * e.unsqueeze(-1)
                )
        return dx, None, da, db, dbias, None, None, None


def lora_linear(
    x: Tensor,
    base: Tensor,
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    rows: Tensor | None,
    scaling: float,
    mode: str,
) -> Tensor:
    """`x @ W_effᵀ + bias` with the low-rank backward (see the module docstring).

    `mode`: "none" (W_eff = W0 + s·(AB)ᵀ), "forward" (every row normalised) or "project" (rows
    where `rows` [.., out] is true normalised). `base` gets no gradient (a frozen buffer).
    """
    return _LoRALinearFn.apply(x, base, a, b, bias, rows, scaling, mode)
