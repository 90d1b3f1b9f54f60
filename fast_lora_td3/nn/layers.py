"""Dense building blocks with an optional leading ensemble axis (docs/DESIGN.md, "Conventions").

A layer built with `ensemble_size=E` stores `weight: [E, out, in]`, `bias: [E, 1, out]` and maps an
input `[B, in]` (shared by all members) or `[E, B, in]` (one batch per member) to `[E, B, out]`.
With `ensemble_size=None` the shapes are those of `nn.Linear` (`[out, in]`, `[out]`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "EnsembleLayerNorm",
    "EnsembleLinear",
    "ensemble_linear",
    "l2_normalize",
    "project_weights_",
]


def ensemble_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Compute `x @ weight.transpose(-1, -2) + bias` for plain or ensemble-stacked weights.

    `weight` is `[out, in]` (bias `[out]`) or `[E, out, in]` (bias `[E, 1, out]`). For the stacked
    case `x` may be `[B, in]` (broadcast to every member without a copy) or `[E, B, in]`.
    """
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    if x.dim() == 2:
        # expand is a view: all members read the same batch, no copy is made.
        x = x.unsqueeze(0).expand(weight.shape[0], -1, -1)
    w_t = weight.transpose(-1, -2)
    if x.dim() == 3:
        # One fused batched GEMM (+ bias) for all members.
        return torch.bmm(x, w_t) if bias is None else torch.baddbmm(bias, x, w_t)
    y = torch.matmul(x, w_t)
    return y if bias is None else y + bias


class _L2Normalize(torch.autograd.Function):
    """`y = x / max(‖x‖, eps)` with a one-pass backward `dx = (dy − y·⟨y, dy⟩) / ‖x‖`.

    Autograd through `F.normalize` runs the division's and the norm's backward separately (about
    twice the full-size passes); SimbaV2 normalises every activation, so this is a large share of
    its elementwise work on CPU (issue 10). Rows with ‖x‖ ≤ eps are divided by eps (no normal term).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, eps: float) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
        denom = norm.clamp_min(eps)
        y = x / denom
        ctx.dim = dim
        ctx.save_for_backward(y, denom, norm > eps)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None, None]:
        y, denom, normal = ctx.saved_tensors
        dot = (y * dy).sum(ctx.dim, keepdim=True) * normal
        return torch.addcmul(dy, y, dot, value=-1.0).div_(denom), None, None


def l2_normalize(x: Tensor, dim: int = -1, eps: float = 1e-8) -> Tensor:
    """Scale `x` to unit L2 norm along `dim` (`x / max(‖x‖, eps)`, so zero vectors stay zero).

    Same values as `F.normalize`; with a gradient, the fused backward of `_L2Normalize` (never
    while tracing for export: a traced graph must not depend on the grad mode of the trace).
    """
    if torch.is_grad_enabled() and x.requires_grad and not torch.jit.is_tracing():
        return _L2Normalize.apply(x, dim, eps)
    return F.normalize(x, p=2.0, dim=dim, eps=eps)


def _weight_shape(out_features: int, in_features: int, ensemble_size: int | None) -> tuple:
    return (
        (out_features, in_features)
        if ensemble_size is None
        else (ensemble_size, out_features, in_features)
    )


def _bias_shape(out_features: int, ensemble_size: int | None) -> tuple:
    return (out_features,) if ensemble_size is None else (ensemble_size, 1, out_features)


def _check_ensemble_size(ensemble_size: int | None) -> None:
    if ensemble_size is not None and ensemble_size < 1:
        raise ValueError(f"ensemble_size must be None or >= 1, got {ensemble_size}")


class EnsembleLinear(nn.Module):
    """Linear layer with an optional leading ensemble axis; each member is initialised independently
    with `nn.Linear`'s default (uniform in ±1/√in for weight and bias)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        ensemble_size: int | None = None,
    ) -> None:
        super().__init__()
        _check_ensemble_size(ensemble_size)
        self.in_features = in_features
        self.out_features = out_features
        self.ensemble_size = ensemble_size
        self.weight = nn.Parameter(
            torch.empty(_weight_shape(out_features, in_features, ensemble_size))
        )
        self.bias = (
            nn.Parameter(torch.empty(_bias_shape(out_features, ensemble_size))) if bias else None
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nn.Linear's default init (kaiming_uniform with a=√5 reduces to U(±1/√in)), per member."""
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight.uniform_(-bound, bound)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """`[B, in]` or `[E, B, in]` → `[E, B, out]` (or `[..., out]` without an ensemble axis)."""
        return ensemble_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        """Shapes shown by `print(module)`."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, ensemble_size={self.ensemble_size}"
        )


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last axis with per-member affine parameters (`[E, 1, dim]` or `[dim]`)."""

    def __init__(self, dim: int, ensemble_size: int | None = None, eps: float = 1e-5) -> None:
        super().__init__()
        _check_ensemble_size(ensemble_size)
        self.dim = dim
        self.eps = eps
        self.ensemble_size = ensemble_size
        shape = _bias_shape(dim, ensemble_size)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last axis, then apply the member's scale and shift."""
        if self.ensemble_size is None:
            return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
        return F.layer_norm(x, (self.dim,), None, None, self.eps) * self.weight + self.bias

    def extra_repr(self) -> str:
        """Shapes shown by `print(module)`."""
        return f"dim={self.dim}, ensemble_size={self.ensemble_size}, eps={self.eps}"


def project_weights_(module: nn.Module) -> None:
    """Call `project_()` of every submodule (the module itself included) under `torch.no_grad()`.

    The learner calls this after each `optimizer.step()`: HyperDense rows go back to the unit sphere
    and LoRA-WN rescales the adapters (SimbaV2 needs unit-norm rows). Each `project_()` touches only
    its own module's tensors, so every tensor is projected exactly once.
    """
    with torch.no_grad():
        for sub in module.modules():
            project = getattr(sub, "project_", None)
            if callable(project):
                project()
