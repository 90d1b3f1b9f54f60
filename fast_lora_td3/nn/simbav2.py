"""SimbaV2 building blocks (Lee et al. 2025): hyperspherical normalisation, LERP residuals.

Two bugs of the reference PyTorch port are avoided on purpose: `Scaler` stores its parameter at
`scale` (not `init·scale`), so its effective initial value is `init`; and every `HyperDense` has its
weight rows projected to unit L2 norm at init and after every optimiser step (`project_()`).
Every module takes `ensemble_size` (None for actors, E for stacked critics) and, for the linears that
may carry adapters, `lora`: None (dense) or the keyword arguments of `LoRALinear`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fast_lora_td3.nn.layers import EnsembleLinear, _bias_shape, ensemble_linear, l2_normalize
from fast_lora_td3.nn.lora import LoRALinear

__all__ = ["HyperDense", "LerpBlock", "Scaler", "SimbaV2Embedder", "SimbaV2Encoder", "SimbaV2Head"]

# Added after the ReLU so that an all-zero hidden vector still has a direction to normalise.
_RELU_EPS = 1e-8


class Scaler(nn.Module):
    """Learnable per-feature scale: parameter stored at `scale`, forward `x · param · (init/scale)`.

    The effective initial value is `init`; `scale` sets the parameter's magnitude and so the size of
    its updates relative to its value.
    """

    def __init__(
        self, dim: int, init: float, scale: float, ensemble_size: int | None = None
    ) -> None:
        super().__init__()
        if scale == 0:
            raise ValueError("Scaler scale must be non-zero")
        self.dim = dim
        self.init = float(init)
        self.scale = float(scale)
        self.forward_factor = self.init / self.scale
        self.scaler = nn.Parameter(torch.full(_bias_shape(dim, ensemble_size), self.scale))

    def effective(self) -> Tensor:
        """The multiplier actually applied, `param · init/scale` (equals `init` at construction)."""
        return self.scaler * self.forward_factor

    def forward(self, x: Tensor) -> Tensor:
        """Multiply the last axis of `x` by the effective scale."""
        return x * self.effective()

    def extra_repr(self) -> str:
        """Configuration shown by `print(module)`."""
        return f"dim={self.dim}, init={self.init:.4g}, scale={self.scale:.4g}"


class HyperDense(nn.Module):
    """Bias-free linear whose weight rows live on the unit sphere (SimbaV2's weight projection).

    Dense: an `EnsembleLinear(bias=False)` initialised orthogonally (per member) and row-normalised
    at init and in `project_()`. LoRA-backed (`lora` = LoRALinear keyword arguments, e.g. `rank`,
    `alpha`, `init`, `kernel_init_scale`, `weight_norm`): a `LoRALinear(bias=False)` whose own
    `project_()` runs LoRA-WN when weight_norm="project" (project_weights_ reaches it); with
    init="zero_b" (weight_norm "forward" or "none"; LoRA-WN rejects it) the base rows are set to
    unit norm so the layer starts as the dense init.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        ensemble_size: int | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.is_lora = lora is not None
        self.linear: EnsembleLinear | LoRALinear
        if lora is None:
            self.linear = EnsembleLinear(
                in_features, out_features, bias=False, ensemble_size=ensemble_size
            )
            with torch.no_grad():
                w = self.linear.weight.view(-1, out_features, in_features)
                for member in w:  # init only: orthogonal_ works on one 2-D matrix at a time
                    nn.init.orthogonal_(member)
            self.project_()
        else:
            self.linear = LoRALinear(
                in_features, out_features, bias=False, ensemble_size=ensemble_size, **lora
            )
            if self.linear.init == "zero_b":
                with torch.no_grad():
                    base = self.linear.base_weight
                    base.copy_(l2_normalize(base))

    @torch.no_grad()
    def project_(self) -> None:
        """Dense: project every weight row to unit L2 norm. LoRA-backed: nothing here (the inner
        LoRALinear's `project_()` is the LoRA-WN step)."""
        if not self.is_lora:
            w = self.linear.weight
            w.copy_(l2_normalize(w))

    def effective_weight(self) -> Tensor:
        """The weight used by the forward pass, `[.., out, in]`."""
        if isinstance(self.linear, LoRALinear):
            return self.linear.effective_weight()
        return self.linear.weight

    def forward(self, x: Tensor) -> Tensor:
        """`[B, in]` or `[E, B, in]` → `[E, B, out]` (or `[..., out]` without an ensemble axis)."""
        return self.linear(x)


class SimbaV2Embedder(nn.Module):
    """Append `c_shift`, L2-normalise, HyperDense(in+1 → h), Scaler(h, √(2/h), √(2/h)), L2-normalise."""

    def __init__(
        self,
        in_features: int,
        width: int,
        c_shift: float = 3.0,
        ensemble_size: int | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.c_shift = float(c_shift)
        self.dense = HyperDense(in_features + 1, width, ensemble_size, lora)
        s = math.sqrt(2.0 / width)
        self.scaler = Scaler(width, init=s, scale=s, ensemble_size=ensemble_size)

    def forward(self, x: Tensor) -> Tensor:
        """`[B, in]` (or `[E, B, in]`) → unit-norm `[E, B, h]` (or `[B, h]`)."""
        x = l2_normalize(F.pad(x, (0, 1), value=self.c_shift))
        return l2_normalize(self.scaler(self.dense(x)))


class LerpBlock(nn.Module):
    """`m = l2(W2 (ReLU(s ⊙ W1 x) + 1e-8))`, `x ← l2(x + α ⊙ (m − x))` (SimbaV2's LERP block).

    W1: h → 4h, s = Scaler(4h, init = scale = √(2/h)/2), W2: 4h → h,
    α = Scaler(h, init 1/(L+1), scale 1/√h) with L the number of blocks.
    """

    def __init__(
        self,
        width: int,
        num_blocks: int,
        ensemble_size: int | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        hidden = 4 * width
        self.w1 = HyperDense(width, hidden, ensemble_size, lora)
        s = math.sqrt(2.0 / width) / 2.0  # √(2/h)/√expansion with expansion 4
        self.s = Scaler(hidden, init=s, scale=s, ensemble_size=ensemble_size)
        self.w2 = HyperDense(hidden, width, ensemble_size, lora)
        self.alpha = Scaler(
            width,
            init=1.0 / (num_blocks + 1),
            scale=1.0 / math.sqrt(width),
            ensemble_size=ensemble_size,
        )

    def forward(self, x: Tensor) -> Tensor:
        """Unit-norm `[.., h]` → unit-norm `[.., h]` (a `[B, h]` input broadcasts to the members)."""
        m = l2_normalize(self.w2(F.relu(self.s(self.w1(x))) + _RELU_EPS))
        return l2_normalize(x + self.alpha(m - x))


class SimbaV2Encoder(nn.Module):
    """Embedder followed by `num_blocks` LERP blocks; output rows have unit L2 norm.

    `lora_embedder` / `lora_blocks`: None (dense) or LoRALinear keyword arguments for the embedder's
    HyperDense / for W1 and W2 of every block.
    """

    def __init__(
        self,
        in_features: int,
        width: int,
        num_blocks: int,
        c_shift: float = 3.0,
        ensemble_size: int | None = None,
        lora_embedder: dict[str, Any] | None = None,
        lora_blocks: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.width = width
        self.embedder = SimbaV2Embedder(in_features, width, c_shift, ensemble_size, lora_embedder)
        self.blocks = nn.ModuleList(
            LerpBlock(width, num_blocks, ensemble_size, lora_blocks) for _ in range(num_blocks)
        )

    def forward(self, x: Tensor) -> Tensor:
        """`[B, in]` or `[E, B, in]` → `[E, B, h]` (or `[B, h]` without an ensemble axis)."""
        x = self.embedder(x)
        for block in self.blocks:
            x = block(x)
        return x


class SimbaV2Head(nn.Module):
    """HyperDense(h → h) → Scaler(h, init 1, scale 1) → HyperDense(h → out) + zero-initialised bias.

    The structure of the official SimbaV2 value and policy heads: the output rows are
    unit norm (projected at init and after every step like every HyperDense), so the logit scale
    is set by the head's Scaler, not by the output weights. `lora` (LoRALinear keyword arguments,
    `critic.lora_layers` `head`) adapts the hidden HyperDense only; the output layer stays dense.
    Shapes follow the ensemble convention: `bias` is `[E, 1, out]` (or `[out]` for actors).
    """

    def __init__(
        self,
        width: int,
        out_features: int,
        ensemble_size: int | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.dense = HyperDense(width, width, ensemble_size, lora)
        self.scaler = Scaler(width, init=1.0, scale=1.0, ensemble_size=ensemble_size)
        self.out = HyperDense(width, out_features, ensemble_size)
        self.bias = nn.Parameter(torch.zeros(_bias_shape(out_features, ensemble_size)))

    def features(self, x: Tensor) -> Tensor:
        """The head's hidden features `Scaler(HyperDense(x))`, before the output layer."""
        return self.scaler(self.dense(x))

    def forward(self, x: Tensor) -> Tensor:
        """`[.., h]` → `[.., out]`: unit-row output layer plus bias, one fused (batched) GEMM."""
        return ensemble_linear(self.features(x), self.out.effective_weight(), self.bias)
