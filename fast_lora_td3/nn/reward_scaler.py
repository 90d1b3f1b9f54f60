"""Reward scaling for a value support that fits any task (SimbaV2's rule).

A C51 critic only represents returns inside its support. Instead of asking the user for the task's
return range, rewards are divided by

    scale = max(σ_G, G_max / g_max)

where G is each env's running discounted return (`G ← γ·G + r`, reset after an episode ends), σ_G
its running standard deviation over all envs and steps, and G_max the largest |G| seen. The first
term gives returns of unit scale; the second bounds every observed return to ±g_max after scaling.
The critic then works on a fixed symmetric support (see `AlgoConfig.support_bounds`), and a fresh
critic's midpoint, 0, is a sensible first guess on every task.

Scaling is linear, so the n-step sum of scaled rewards is the scaled n-step sum: the replay keeps
raw rewards and the learner scales each sampled batch with the current scale. Statistics are updated
from rollout rewards only (never from replay samples), like the observation normaliser.
"""

# No `from __future__ import annotations`: keep real annotations like the normaliser (TorchScript).
import torch
import torch.distributed as dist
from torch import Tensor, nn

from fast_lora_td3.nn.normalizer import EmpiricalNormalizer

__all__ = ["RewardScaler"]


class RewardScaler(nn.Module):
    """Running statistics of discounted returns and the reward scale they imply.

    Buffers: `returns.mean/var/count` (an `EmpiricalNormalizer` over G), `abs_max` (fp32 0-d, G_max).
    Before any update the scale is 1. `distributed=True` merges every rank's returns (moments summed,
    G_max by MAX), so all ranks scale identically and replicas stay equal.
    """

    abs_max: Tensor

    def __init__(self, g_max: float, eps: float = 1e-8, *, distributed: bool = False) -> None:
        super().__init__()
        self.g_max = float(g_max)
        self.eps = float(eps)
        self.returns = EmpiricalNormalizer(1)
        self.register_buffer("abs_max", torch.zeros(()))
        self.distributed = distributed

    @property
    def distributed(self) -> bool:
        """Whether updates merge the statistics of every rank."""
        return self.returns.distributed

    @distributed.setter
    def distributed(self, value: bool) -> None:
        self.returns.distributed = value

    @torch.no_grad()
    def update(self, discounted_returns: Tensor) -> None:
        """Merge one step's running discounted returns G of every env (`[num_envs]`)."""
        if not self.training:
            return
        g = discounted_returns.detach().float()
        self.returns.update(g.reshape(-1, 1))
        step_max = g.abs().max()
        if self.distributed and dist.is_available() and dist.is_initialized():
            dist.all_reduce(step_max, op=dist.ReduceOp.MAX)
        self.abs_max.copy_(torch.maximum(self.abs_max, step_max))

    def scale(self) -> Tensor:
        """The divisor of rewards, `max(σ_G, G_max / g_max)` (0-d; 1 before any update)."""
        seen = self.returns.count > 0
        sigma = (self.returns.var[0] + self.eps).sqrt()
        scale = torch.maximum(sigma, self.abs_max / self.g_max)
        return torch.where(seen, scale, torch.ones_like(scale))

    def forward(self, rewards: Tensor) -> Tensor:
        """Scaled rewards (any shape, in their own dtype)."""
        return rewards / self.scale().to(rewards.dtype)

    def extra_repr(self) -> str:
        return f"g_max={self.g_max}, eps={self.eps}"
