"""C51 distributional support and the categorical projection (Bellemare et al. 2017).

The projection is exact for targets that land on an atom (all mass goes to that atom), vectorised
(two `scatter_add_` calls, no Python loop over samples or atoms), free of host synchronisation and
traceable by `torch.compile`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fast_lora_td3.errors import ConfigError

__all__ = ["C51Support", "expected_value", "project_distribution"]


class C51Support(nn.Module):
    """Fixed categorical support `linspace(v_min, v_max, num_atoms)`.

    Buffers `support` [num_atoms] and `delta_z` (0-d) follow `.to(device)`; `v_min`, `v_max`,
    `num_atoms` and `dz` are also kept as Python numbers so the projection bakes them in as
    constants (no device reads, no recompiles).
    """

    support: Tensor
    delta_z: Tensor

    def __init__(self, v_min: float, v_max: float, num_atoms: int) -> None:
        super().__init__()
        v_min, v_max = float(v_min), float(v_max)
        if not v_min < v_max:
            raise ConfigError(
                f"algo.v_min={v_min} must be smaller than algo.v_max={v_max} "
                "(the C51 support is linspace(v_min, v_max, num_atoms))"
            )
        if int(num_atoms) != num_atoms or num_atoms < 2:
            raise ConfigError(f"algo.num_atoms={num_atoms} must be an integer >= 2")
        self.v_min = v_min
        self.v_max = v_max
        self.num_atoms = int(num_atoms)
        self.dz = (v_max - v_min) / (self.num_atoms - 1)
        support = torch.linspace(v_min, v_max, self.num_atoms, dtype=torch.float32)
        self.register_buffer("support", support)
        self.register_buffer("delta_z", torch.tensor(self.dz, dtype=torch.float32))

    def atoms(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        """The support values, optionally moved/cast."""
        return self.support.to(device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"v_min={self.v_min}, v_max={self.v_max}, num_atoms={self.num_atoms}"


def project_distribution(
    next_probs: Tensor,
    rewards: Tensor,
    bootstrap: Tensor,
    discount: Tensor,
    support: C51Support,
) -> Tensor:
    """Project the shifted distribution `r + bootstrap·discount·z` back onto the support.

    Args:
        next_probs: target probabilities `[..., B, A]` (any float dtype; computed in fp32).
            A leading ensemble axis `[E, B, A]` is supported: rewards etc. broadcast over it.
        rewards: `[B]` (n-step discounted reward sums; for SAC already entropy-adjusted).
        bootstrap: `[B]`, 1 − terminated (0 or 1; any float in [0, 1] works).
        discount: `[B]`, γ^k.
        support: the C51 support.

    Returns:
        fp32 probabilities of the same shape as `next_probs`; each row sums to the row sum of
        `next_probs` (1 for a distribution). `b = (clamp(z') − v_min)/Δz` gives mass `(l + 1 − b)`
        to atom `l = min(floor(b), A − 2)` and `(b − l)` to `l + 1`; an integral `b` therefore puts
        all mass on atom `b` (including `b = A − 1`, where `l = A − 2` and the weight is 1 on `A − 1`).
    """
    num_atoms = support.num_atoms
    probs = next_probs.float()
    z = support.support.to(device=probs.device, dtype=torch.float32)
    scale = (bootstrap.float() * discount.float()).unsqueeze(-1)
    target_z = (rewards.float().unsqueeze(-1) + scale * z).clamp(support.v_min, support.v_max)
    b = ((target_z - support.v_min) / support.dz).clamp(0.0, num_atoms - 1)
    # A NaN target must not become an out-of-range index; the trainer's NaN guard reports it.
    b = torch.nan_to_num(b, nan=0.0)
    # Upper neighbour is always l + 1 ≤ A − 1, so an integral b never splits mass between l and u.
    lower = b.floor().clamp(max=num_atoms - 2)
    w_upper = b - lower
    shape = torch.broadcast_shapes(probs.shape, b.shape)
    probs = probs.expand(shape).reshape(-1, num_atoms)
    w_upper = w_upper.expand(shape).reshape(-1, num_atoms)
    lower_idx = lower.to(torch.int64).expand(shape).reshape(-1, num_atoms)
    out = torch.zeros_like(probs)
    out.scatter_add_(1, lower_idx, probs * (1.0 - w_upper))
    out.scatter_add_(1, lower_idx + 1, probs * w_upper)
    return out.reshape(shape)


def expected_value(values: Tensor, support: C51Support, *, from_logits: bool = False) -> Tensor:
    """Mean of a categorical distribution over the support: `Σ_a p_a z_a` (fp32, shape `[...]`).

    `values` are probabilities `[..., A]`, or logits when `from_logits=True` (softmax in fp32).
    """
    probs = torch.softmax(values.float(), dim=-1) if from_logits else values.float()
    z = support.support.to(device=probs.device, dtype=torch.float32)
    return (probs * z).sum(-1)
