"""LoRA linear layers with a frozen random base and LoRA-WN (LoRA critics, arXiv 2604.18978).

`y = x W0ᵀ (+ b) + (α/r)·(x A) B` is computed as one GEMM with the merged weight
`W_eff = W0 + (α/r)·(A B)ᵀ`; the merge is an `r·in·out` GEMM, small against the batch GEMM.
`LoRALinear`, `effective_weight()`, `base_weight`, `lora_A` and `lora_B` are stable names that
scripts rely on.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import LORA_INITS, WEIGHT_NORMS
from fast_lora_td3.nn.layers import _bias_shape, _weight_shape, ensemble_linear, l2_normalize
from fast_lora_td3.nn.lora_autograd import lora_linear, none_flagged

__all__ = [
    "LORA_INITS",
    "WEIGHT_NORMS",
    "LoRALinear",
    "adapter_parameters",
    "check_lora_wn",
    "dense_trainable_parameters",
    "lora_layers",
    "merge_lora_",
]

# Below this squared norm a ΔW row counts as zero: no root can move the row, the forward normalises it.
_MIN_DELTA_SQ = 1e-12
# A base row with |‖w0‖² − 1| below this lies on the unit sphere (up to float32 rounding of the sum):
# its roots are 0 and a reflection of the row, neither a projection, so the forward normalises it.
_ON_SPHERE_TOL = 1e-5


def check_lora_wn(init: str, kernel_init_scale: float, weight_norm: str) -> None:
    """ConfigError when LoRA-WN (weight_norm="project") cannot be well defined for the init.

    The projection moves row j along the line `w0_j + c·Δw_j`; it has a unique, continuous positive
    root only while the base row lies strictly inside the unit sphere and ΔW is not zero. zero_b
    starts at ΔW = 0 (a first step would snap every row by a factor ~1/‖Δw‖), and κ >= 1 puts the
    base on or outside the sphere (roots 0 and a reflection, or none).
    """
    if weight_norm != "project":
        return
    if init == "zero_b":
        raise ConfigError(
            "critic.lora_init=zero_b cannot be used with critic.weight_norm=project (ΔW = 0 leaves "
            "LoRA-WN no well-defined scale); use critic.weight_norm=forward or critic.lora_init=paper"
        )
    if kernel_init_scale >= 1:
        raise ConfigError(
            f"critic.kernel_init_scale={kernel_init_scale} must be < 1 with critic.weight_norm=project "
            "(LoRA-WN needs base rows strictly inside the unit sphere); use e.g. 0.5"
        )


def _rescale_rows_(w: Tensor, norm: float) -> None:
    """Scale every row (last axis) of `w` in place to L2 norm `norm`."""
    w.copy_(l2_normalize(w) * norm)


class LoRALinear(nn.Module):
    """Linear layer `W0 + (α/r)(A B)ᵀ` with `W0` a frozen random buffer and trainable `A`, `B`.

    Shapes (with `ensemble_size=E`; drop the `E` axis for `None`): `base_weight [E, out, in]`
    (buffer), `lora_A [E, in, r]`, `lora_B [E, r, out]`, `bias [E, 1, out]`,
    `fallback_rows [E, out]` (bool buffer: rows the forward pass row-normalises).

    init="paper": W0 orthogonal, A and B normal with std 1/√min(shape); each base row and each row of
    the initial ΔW is rescaled to norm √κ (ΔW via B's columns). init="zero_b": W0 has nn.Linear's
    default init (κ unused), A normal, B = 0, so ΔW starts at 0 (with weight_norm "forward" or
    "none" only: `check_lora_wn` rejects zero_b and κ >= 1 under "project").

    weight_norm="project": `project_()` applies LoRA-WN (every effective row to unit norm by scaling
    B's columns; rows with no positive root are flagged and normalised in the forward), and is
    applied once at construction. "forward": `effective_weight()` always row-normalises.
    "none": plain LoRA.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float | None = None,
        bias: bool = True,
        *,
        ensemble_size: int | None = None,
        init: str = "paper",
        kernel_init_scale: float = 0.5,
        weight_norm: str = "none",
    ) -> None:
        super().__init__()
        if not 0 < rank < min(in_features, out_features):
            raise ConfigError(
                f"critic.rank={rank} is invalid for a {in_features}→{out_features} LoRA layer: "
                f"need 0 < rank < {min(in_features, out_features)} (= min(in, out))"
            )
        if init not in LORA_INITS:
            raise ConfigError(f"critic.lora_init={init!r} is invalid; choose one of {LORA_INITS}")
        if weight_norm not in WEIGHT_NORMS:
            raise ConfigError(
                f"critic.weight_norm={weight_norm!r} is invalid; choose one of {WEIGHT_NORMS}"
            )
        if kernel_init_scale <= 0:
            raise ConfigError(f"critic.kernel_init_scale={kernel_init_scale} must be > 0")
        check_lora_wn(init, kernel_init_scale, weight_norm)
        self.in_features = in_features
        self.out_features = out_features
        self.rank = rank
        self.alpha = float(rank if alpha is None else alpha)
        self.scaling = self.alpha / rank
        self.ensemble_size = ensemble_size
        self.init = init
        self.kernel_init_scale = kernel_init_scale
        self.weight_norm = weight_norm
        # Set by merge_into_base_: the layer is then a dense layer holding a merged weight (targets).
        self.merged = False
        lead = () if ensemble_size is None else (ensemble_size,)
        w_shape = _weight_shape(out_features, in_features, ensemble_size)
        self.register_buffer("base_weight", torch.empty(w_shape))
        self.lora_A = nn.Parameter(torch.empty((*lead, in_features, rank)))
        self.lora_B = nn.Parameter(torch.empty((*lead, rank, out_features)))
        self.bias = (
            nn.Parameter(torch.empty(_bias_shape(out_features, ensemble_size))) if bias else None
        )
        self.register_buffer("fallback_rows", torch.zeros((*lead, out_features), dtype=torch.bool))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re)draw base, adapters and bias per member as described in the class docstring."""
        bound = 1.0 / math.sqrt(self.in_features)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound)
        self.lora_A.normal_(0.0, 1.0 / math.sqrt(min(self.in_features, self.rank)))
        self.fallback_rows.zero_()
        self.merged = False
        if self.init == "zero_b":
            self.base_weight.uniform_(-bound, bound)
            self.lora_B.zero_()
        else:
            root_k = math.sqrt(self.kernel_init_scale)
            base = self.base_weight.view(-1, self.out_features, self.in_features)
            for member in base:  # init only: orthogonal_ works on one 2-D matrix at a time
                nn.init.orthogonal_(member)
            _rescale_rows_(self.base_weight, root_k)
            self.lora_B.normal_(0.0, 1.0 / math.sqrt(min(self.rank, self.out_features)))
            # Row j of ΔW is (α/r)·(A B[:, j])ᵀ: scaling column j of B rescales that row alone.
            row_norms = torch.linalg.vector_norm(self.delta_weight(), dim=-1)
            self.lora_B.mul_((root_k / row_norms.clamp_min(1e-12)).unsqueeze(-2))
        if self.weight_norm == "project":
            self.project_()

    def delta_weight(self) -> Tensor:
        """`ΔW = (α/r)·(A B)ᵀ`, shape `[.., out, in]`, computed as `Bᵀ Aᵀ` to land in row layout."""
        return self.scaling * torch.matmul(
            self.lora_B.transpose(-1, -2), self.lora_A.transpose(-1, -2)
        )

    def effective_weight(self) -> Tensor:
        """Merged weight `W0 + (α/r)(A B)ᵀ` (`[.., out, in]`), row-normalised per `weight_norm`."""
        if self.merged:
            return self.base_weight
        b_t = self.lora_B.transpose(-1, -2)
        a_t = self.lora_A.transpose(-1, -2)
        if self.base_weight.dim() == 2:
            w = torch.addmm(self.base_weight, b_t, a_t, alpha=self.scaling)
        else:
            w = torch.baddbmm(self.base_weight, b_t, a_t, alpha=self.scaling)
        if self.weight_norm == "forward":
            return l2_normalize(w)
        if self.weight_norm == "project" and not none_flagged(self.fallback_rows):
            # Branch-free fallback: flagged rows (no LoRA-WN root) are normalised here instead.
            return torch.where(self.fallback_rows.unsqueeze(-1), l2_normalize(w), w)
        return w

    def forward(self, x: Tensor) -> Tensor:
        """`[B, in]` or `[E, B, in]` → `[E, B, out]` (or `[..., out]` without an ensemble axis).

        One GEMM with the merged weight; the adapters' gradients take the low-rank path
        (nn/lora_autograd.py), so the backward never forms the full `dW` of the frozen base.
        """
        if self.merged:
            return ensemble_linear(x, self.base_weight, self.bias)
        return lora_linear(
            x,
            self.base_weight,
            self.lora_A,
            self.lora_B,
            self.bias,
            self.fallback_rows,
            self.scaling,
            self.weight_norm,
        )

    @torch.no_grad()
    def project_(self) -> None:
        """LoRA-WN: per output row j, scale column j of B by the root `c_j > 0` of
        `c²‖Δw_j‖² + 2c⟨w0_j, Δw_j⟩ + ‖w0_j‖² − 1 = 0`, so that `‖w0_j + c_j Δw_j‖ = 1`.

        For the supported bases (‖w0_j‖ < 1, see `check_lora_wn`) the constant term is negative, so
        there is exactly one positive root, a continuous function of (w0, ΔW); it is computed
        without cancellation (q = −(b + sign(b)·√disc), roots q/a and c0/q). A base row on the unit
        sphere (|‖w0‖² − 1| ≤ 1e-5) has only the roots 0 and a reflection of the row, and a row with
        ‖Δw_j‖ ≈ 0 has none: such rows keep B and are flagged in `fallback_rows` for the forward.
        Bases outside the sphere (loaded by hand) take the positive root closest to 1, if any.
        Vectorised and free of host syncs. A no-op unless weight_norm="project" and not merged.
        """
        if self.weight_norm != "project" or self.merged:
            return
        w0 = self.base_weight.float()
        delta = self.delta_weight().float()
        a = (delta * delta).sum(-1)
        b = (w0 * delta).sum(-1)  # half the linear coefficient
        c0 = (w0 * w0).sum(-1) - 1.0
        disc = b * b - a * c0
        sq = disc.clamp_min(0.0).sqrt()
        # Cancellation-free quadratic roots: q/a and c0/q with q = -(b + sign(b)·√disc).
        q = -(b + torch.copysign(sq, b))
        q_ok = q != 0
        a_ok = a > _MIN_DELTA_SQ
        r1 = torch.where(a_ok, q / torch.where(a_ok, a, 1.0), -1.0)
        r2 = torch.where(q_ok, c0 / torch.where(q_ok, q, 1.0), -1.0)
        valid = a_ok & (disc >= 0) & (c0.abs() > _ON_SPHERE_TOL)
        pos1 = valid & (r1 > 0)
        pos2 = valid & (r2 > 0)
        r1_closer = (r1 - 1.0).abs() <= (r2 - 1.0).abs()
        c = torch.where(pos1 & (r1_closer | ~pos2), r1, torch.where(pos2, r2, 1.0))
        has_root = pos1 | pos2
        self.lora_B.mul_(c.to(self.lora_B.dtype).unsqueeze(-2))
        self.fallback_rows.copy_(~has_root)

    @torch.no_grad()
    def merge_into_base_(self, weight: Tensor | None = None) -> None:
        """Turn the layer into a dense layer holding `weight` (default: its own effective weight):
        `base_weight ← weight`, `lora_B ← 0`, no fallback rows, and `effective_weight()` then
        returns `base_weight` unnormalised. Used for target critics (the target keeps the
        merged effective weight; Polyak then mixes effective weights, like a dense target)."""
        new = self.effective_weight() if weight is None else weight
        self.base_weight.copy_(new)
        self.lora_B.zero_()
        self.fallback_rows.zero_()
        self.merged = True

    def lora_parameters(self) -> list[nn.Parameter]:
        """The trainable adapters `[lora_A, lora_B]` (own optimiser group, own weight decay)."""
        return [self.lora_A, self.lora_B]

    def extra_repr(self) -> str:
        """Configuration shown by `print(module)`."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"alpha={self.alpha}, bias={self.bias is not None}, ensemble_size={self.ensemble_size}, "
            f"init={self.init}, weight_norm={self.weight_norm}, merged={self.merged}"
        )


def lora_layers(module: nn.Module) -> list[LoRALinear]:
    """Every `LoRALinear` in `module` (itself included), in `module.modules()` order."""
    return [m for m in module.modules() if isinstance(m, LoRALinear)]


def adapter_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Trainable LoRA adapters (`lora_A`, `lora_B`) of every LoRALinear in `module`."""
    return [p for layer in lora_layers(module) for p in layer.lora_parameters() if p.requires_grad]


def dense_trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Every other parameter with `requires_grad` (embedder, heads, scalers, norms, biases).

    Frozen bases are buffers, so they are never returned by either helper.
    """
    adapters = {id(p) for p in adapter_parameters(module)}
    return [p for p in module.parameters() if p.requires_grad and id(p) not in adapters]


def merge_lora_(module: nn.Module) -> None:
    """`merge_into_base_()` every LoRALinear of `module`: call on a fresh deep copy of the online
    critic to make its target (and before loading a target's state dict)."""
    for layer in lora_layers(module):
        layer.merge_into_base_()
