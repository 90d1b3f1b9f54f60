"""Actors: deterministic tanh (FastTD3) and tanh-Gaussian (FastSAC).

Both use an MLP trunk (512-256-128, ReLU or Linear → LayerNorm → SiLU) with linear heads, or a
SimbaV2 encoder with SimbaV2 heads (HyperDense(h → h) → Scaler(h, 1, 1) → unit-row HyperDense +
zero bias, like the official SimbaV2 heads; SAC has separate mean and log-std heads, as the official
HyperNormalTanhPolicy). Actors have no ensemble axis.
Actions are in [-1, 1]; scaling to joint limits is the environment's business.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import ACTOR_FAMILIES, ActorConfig
from fast_lora_td3.nn.layers import EnsembleLayerNorm, EnsembleLinear
from fast_lora_td3.nn.simbav2 import SimbaV2Encoder, SimbaV2Head

__all__ = [
    "ACTOR_FAMILIES",
    "ACTOR_KINDS",
    "LOG_STD_MAX",
    "LOG_STD_MIN",
    "DeterministicActor",
    "TanhGaussianActor",
    "build_actor",
]

ACTOR_KINDS = ("td3", "sac")
LOG_STD_MIN = -5.0
LOG_STD_MAX = 0.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def build_trunk(obs_dim: int, cfg: ActorConfig) -> tuple[nn.Module, int]:
    """The actor's feature extractor and its output width (the heads come on top)."""
    cfg.check()
    if cfg.family == "simbav2":
        return SimbaV2Encoder(obs_dim, cfg.width, cfg.num_blocks, cfg.c_shift), cfg.width
    layers: list[nn.Module] = []
    dims = [obs_dim, *cfg.hidden_dims]
    for i, o in itertools.pairwise(dims):
        layers.append(EnsembleLinear(i, o))
        if cfg.activation == "silu_layernorm":
            layers += [EnsembleLayerNorm(o), nn.SiLU()]
        else:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers), dims[-1]


def build_head(feat: int, action_dim: int, cfg: ActorConfig, std: float) -> nn.Module:
    """SimbaV2 family: a `SimbaV2Head` (unit rows, zero bias). MLP: a linear layer with weight
    N(0, std) (std 0 → zeros) and zero bias."""
    if cfg.family == "simbav2":
        return SimbaV2Head(feat, action_dim)
    layer = EnsembleLinear(feat, action_dim)
    with torch.no_grad():
        if std > 0:
            layer.weight.normal_(0.0, std)
        else:
            layer.weight.zero_()
        if layer.bias is not None:
            layer.bias.zero_()
    return layer


class DeterministicActor(nn.Module):
    """TD3 actor: `tanh(head(trunk(obs)))`; MLP head N(0, last_layer_std) with zero bias, SimbaV2
    head unit rows with zero bias."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: ActorConfig) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.trunk, feat = build_trunk(obs_dim, cfg)
        self.out = build_head(feat, action_dim, cfg, cfg.last_layer_std)

    def forward(self, obs: Tensor) -> Tensor:
        """`[B, obs_dim]` → actions `[B, action_dim]` in [-1, 1]."""
        return torch.tanh(self.preactivation(obs))

    def preactivation(self, obs: Tensor) -> Tensor:
        """`[B, obs_dim]` → the pre-tanh output `u` (actions are `tanh(u)`)."""
        return self.out(self.trunk(obs))

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """The policy's action (exploration noise is the collector's business)."""
        return self.forward(obs)


class TanhGaussianActor(nn.Module):
    """SAC actor: `a = tanh(μ + σ ε)`, `log σ = −5 + 2.5·(tanh(h) + 1) ∈ [−5, 0]`; separate mean
    and log-std heads, zero-initialised for the MLP (FastSAC), SimbaV2 heads (unit rows, zero
    bias) for the SimbaV2 family."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: ActorConfig) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.trunk, feat = build_trunk(obs_dim, cfg)
        self.mean = build_head(feat, action_dim, cfg, 0.0)
        self.log_std = build_head(feat, action_dim, cfg, 0.0)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """`[B, obs_dim]` → `(mean, log_std)`, each `[B, action_dim]` (pre-tanh Gaussian)."""
        h = self.trunk(obs)
        half_range = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
        log_std = LOG_STD_MIN + half_range * (torch.tanh(self.log_std(h)) + 1.0)
        return self.mean(h), log_std

    def sample(
        self, obs: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterised sample: `(action [B, a], log_prob [B])` with the tanh correction.

        `log π(a) = Σ [log N(u; μ, σ) − log(1 − tanh² u)]` with the stable identity
        `log(1 − tanh² u) = 2 (log 2 − u − softplus(−2u))`; computed in at least float32.
        """
        mean, log_std = self.forward(obs)
        dtype = torch.promote_types(mean.dtype, torch.float32)
        mean, log_std = mean.to(dtype), log_std.to(dtype)
        if generator is None:
            # randn_like keeps symbolic batch sizes intact under torch.compile's dynamic shapes.
            eps = torch.randn_like(mean, dtype=dtype)
        else:
            eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=dtype)
        u = mean + log_std.exp() * eps
        log_det = 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))
        log_prob = (-0.5 * eps.square() - log_std - _HALF_LOG_2PI - log_det).sum(-1)
        return torch.tanh(u), log_prob

    def act(
        self, obs: Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> Tensor:
        """`tanh(mean)` when deterministic (evaluation, export), else a sampled action."""
        if deterministic:
            return torch.tanh(self.forward(obs)[0])
        return self.sample(obs, generator)[0]


def build_actor(
    cfg: ActorConfig, obs_dim: int, action_dim: int, kind: str = "td3"
) -> DeterministicActor | TanhGaussianActor:
    """Build the TD3 (`kind="td3"`) or SAC (`kind="sac"`) actor; ConfigError on bad settings."""
    if kind not in ACTOR_KINDS:
        raise ConfigError(
            f"actor kind {kind!r} is invalid; choose 'td3' (algo=fasttd3) or 'sac' (algo=fastsac)"
        )
    if obs_dim < 1 or action_dim < 1:
        raise ConfigError(f"actor dims must be positive (obs {obs_dim}, action {action_dim})")
    cfg.check()
    cls = DeterministicActor if kind == "td3" else TanhGaussianActor
    return cls(obs_dim, action_dim, cfg)
