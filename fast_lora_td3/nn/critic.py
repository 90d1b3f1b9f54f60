"""Twin (ensemble) distributional critics: all members in one batched computation (SPEC §2.1–§2.4).

Families: `mlp` (FastTD3 ReLU or FastSAC SiLU+LayerNorm), `mlp_lora` (LoRALinear for the chosen
linears), `simbav2` and `simbav2_lora` (LoRA on the chosen HyperDense layers). Every layer carries
the leading ensemble axis E = `cfg.num_members`; the output is C51 logits `[E, B, num_atoms]`.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor, nn

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import CRITIC_FAMILIES, CriticConfig
from fast_lora_td3.nn.layers import EnsembleLayerNorm, EnsembleLinear
from fast_lora_td3.nn.lora import LoRALinear, adapter_parameters, dense_trainable_parameters
from fast_lora_td3.nn.simbav2 import SimbaV2Encoder, SimbaV2Head

__all__ = [
    "CRITIC_FAMILIES",
    "TwinCritic",
    "adapter_parameters",
    "build_critic",
    "dense_trainable_parameters",
]


def _lora_kwargs(cfg: CriticConfig, weight_norm: str) -> dict[str, Any]:
    return {
        "rank": cfg.rank,
        "alpha": cfg.alpha,
        "init": cfg.lora_init,
        "kernel_init_scale": cfg.kernel_init_scale,
        "weight_norm": weight_norm,
    }


def _ensemble_mlp(
    in_dim: int,
    hidden_dims: list[int],
    out_dim: int,
    activation: str,
    ensemble_size: int,
    lora_hidden: dict[str, Any] | None,
    lora_out: dict[str, Any] | None,
) -> nn.Sequential:
    """Linear → (LayerNorm →) activation per hidden width, then a linear output layer."""

    def linear(i: int, o: int, lora: dict[str, Any] | None) -> nn.Module:
        if lora is None:
            return EnsembleLinear(i, o, ensemble_size=ensemble_size)
        return LoRALinear(i, o, ensemble_size=ensemble_size, **lora)

    layers: list[nn.Module] = []
    dims = [in_dim, *hidden_dims]
    for i, o in itertools.pairwise(dims):
        layers.append(linear(i, o, lora_hidden))
        if activation == "silu_layernorm":
            layers += [EnsembleLayerNorm(o, ensemble_size), nn.SiLU()]
        else:
            layers.append(nn.ReLU())
    layers.append(linear(dims[-1], out_dim, lora_out))
    return nn.Sequential(*layers)


class TwinCritic(nn.Module):
    """`num_members` Q-networks on `concat(obs, action)`, evaluated as one batched computation.

    `mlp_lora` adapts the hidden linears (`lora_layers` `hidden`, or its alias `blocks`) and also
    the output layer with `all`. It uses LoRALinear with weight_norm="none" (unit-norm rows are a SimbaV2 constraint,
    an MLP with biases has none); `cfg.weight_norm` applies to `simbav2_lora` only.
    """

    def __init__(self, obs_dim: int, action_dim: int, num_atoms: int, cfg: CriticConfig) -> None:
        super().__init__()
        cfg.check()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.num_atoms = num_atoms
        self.num_members = cfg.num_members
        self.family = cfg.family
        in_dim = obs_dim + action_dim
        e = cfg.num_members
        self.net: nn.Module
        if cfg.family in ("mlp", "mlp_lora"):
            lora_hidden = lora_out = None
            if cfg.family == "mlp_lora":
                lora_hidden = _lora_kwargs(
                    cfg, "none"
                )  # both "hidden" and "all" adapt hidden layers
                lora_out = lora_hidden if "all" in cfg.lora_layers else None
            self.net = _ensemble_mlp(
                in_dim, list(cfg.hidden_dims), num_atoms, cfg.activation, e, lora_hidden, lora_out
            )
        else:
            where = set(cfg.lora_layers) if cfg.family == "simbav2_lora" else set()
            lora = _lora_kwargs(cfg, cfg.weight_norm)
            self.net = nn.Sequential(
                SimbaV2Encoder(
                    in_dim,
                    cfg.width,
                    cfg.num_blocks,
                    cfg.c_shift,
                    ensemble_size=e,
                    lora_embedder=lora if "embedder" in where else None,
                    lora_blocks=lora if "blocks" in where else None,
                ),
                SimbaV2Head(cfg.width, num_atoms, e, lora if "head" in where else None),
            )

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        """`obs [B, o]`, `action [B, a]` (or both `[E, B, ·]`, one batch per member) → logits
        `[E, B, num_atoms]`."""
        return self.net(torch.cat([obs, action], dim=-1))


def build_critic(cfg: CriticConfig, obs_dim: int, action_dim: int, num_atoms: int) -> TwinCritic:
    """Validate `cfg` and build the twin critic for its family (ConfigError lists valid values)."""
    cfg.check()
    if obs_dim < 1 or action_dim < 1:
        raise ConfigError(
            f"critic input dims must be positive (obs {obs_dim}, action {action_dim})"
        )
    if num_atoms < 2:
        raise ConfigError(f"algo.num_atoms={num_atoms} must be >= 2")
    return TwinCritic(obs_dim, action_dim, num_atoms, cfg)
