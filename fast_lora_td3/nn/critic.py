"""Twin (ensemble) distributional critics: all members in one batched computation.

Every layer carries the leading ensemble axis E = `cfg.num_members`; the output is C51 logits
`[E, B, num_atoms]`. A family is a row of `CRITIC_FAMILIES` (name → builder, checks, adapted
widths); `register_critic_family` adds one. Built in: `mlp` (FastTD3 ReLU or FastSAC
SiLU+LayerNorm), `simbav2`, `simbav2_lora` (LoRA on the chosen HyperDense layers) and `mlp_lora`
(LoRALinear for the chosen linears).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.config import CriticConfig
from fast_lora_td3.nn.layers import EnsembleLayerNorm, EnsembleLinear
from fast_lora_td3.nn.lora import (
    LoRALinear,
    adapter_parameters,
    check_lora_wn,
    dense_trainable_parameters,
)
from fast_lora_td3.nn.simbav2 import SimbaV2Encoder, SimbaV2Head

__all__ = [
    "CRITIC_FAMILIES",
    "CriticFamily",
    "TwinCritic",
    "adapter_parameters",
    "build_critic",
    "critic_adapted_widths",
    "dense_trainable_parameters",
    "register_critic_family",
]

CriticNetBuilder = Callable[[CriticConfig, int, int], nn.Module]
"""`(cfg, in_dim, num_atoms) → net`: maps `[B, in_dim]` (or `[E, B, in_dim]`) to logits
`[E, B, num_atoms]` with E = `cfg.num_members`."""


@dataclass(frozen=True)
class CriticFamily:
    """One critic family: how to build its network and how to check its settings."""

    build: CriticNetBuilder
    """Builds the ensemble network from the config, the input width (obs + action) and the atoms."""
    validate: Callable[[CriticConfig], None]
    """Raises ConfigError (one line naming the setting) on a config this family cannot build."""
    adapted_widths: Callable[[CriticConfig], list[int]] | None = None
    """LoRA families: the widths of the adapted layers (the rank must be below their minimum)."""


CRITIC_FAMILIES: dict[str, CriticFamily] = {}
"""Family name → `CriticFamily`; `critic.family` must be one of its keys."""


def register_critic_family(
    name: str,
    build: CriticNetBuilder,
    validate: Callable[[CriticConfig], None] | None = None,
    adapted_widths: Callable[[CriticConfig], list[int]] | None = None,
) -> None:
    """Make `critic.family=<name>` build `build(cfg, in_dim, num_atoms)` (see `CriticNetBuilder`).

    `validate` runs after CriticConfig's field checks and the family-name check; give
    `adapted_widths` for a LoRA family so the run-level rank check covers it.
    """
    if name in CRITIC_FAMILIES:
        raise ValueError(f"critic family {name!r} is already registered")
    CRITIC_FAMILIES[name] = CriticFamily(build, validate or (lambda cfg: None), adapted_widths)


# mlp_lora also accepts `blocks` (the config default) as an alias of `hidden`: an MLP's hidden
# linears play the role of SimbaV2's residual-block linears.
_LORA_LAYER_SETS = {
    "simbav2_lora": ("blocks", "embedder", "head"),
    "mlp_lora": ("hidden", "all", "blocks"),
}


def validate_critic_config(cfg: CriticConfig) -> None:
    """The family's rules (CriticConfig.check covers single fields): raise ConfigError (one line
    naming the setting and the valid values) on a config the family cannot build."""
    family = CRITIC_FAMILIES.get(cfg.family)
    if family is None:
        raise ConfigError(
            f"critic.family={cfg.family!r} is invalid; choose one of {', '.join(CRITIC_FAMILIES)}"
        )
    family.validate(cfg)


def _validate_lora(cfg: CriticConfig) -> None:
    """The rules of the `*_lora` families: which layers they adapt, LoRA-WN compatibility."""
    valid_sets = _LORA_LAYER_SETS[cfg.family]
    if cfg.family == "simbav2_lora":  # mlp_lora always runs weight_norm="none"
        check_lora_wn(cfg.lora_init, cfg.kernel_init_scale, cfg.weight_norm)
    layers = list(cfg.lora_layers)
    bad = [name for name in layers if name not in valid_sets]
    if bad or not layers:
        raise ConfigError(
            f"critic.lora_layers={layers} is invalid for critic.family={cfg.family}; "
            f"give a non-empty list drawn from {list(valid_sets)}"
        )


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


def _build_mlp(cfg: CriticConfig, in_dim: int, num_atoms: int) -> nn.Module:
    e = cfg.num_members
    return _ensemble_mlp(in_dim, list(cfg.hidden_dims), num_atoms, cfg.activation, e, None, None)


def _build_mlp_lora(cfg: CriticConfig, in_dim: int, num_atoms: int) -> nn.Module:
    """LoRALinear with weight_norm="none": unit-norm rows are a SimbaV2 constraint, an MLP with
    biases has none. Both `hidden` and `all` adapt the hidden layers; `all` the output one too."""
    lora_hidden = _lora_kwargs(cfg, "none")
    lora_out = lora_hidden if "all" in cfg.lora_layers else None
    hidden = list(cfg.hidden_dims)
    e = cfg.num_members
    return _ensemble_mlp(in_dim, hidden, num_atoms, cfg.activation, e, lora_hidden, lora_out)


def _build_simbav2(cfg: CriticConfig, in_dim: int, num_atoms: int) -> nn.Module:
    """SimbaV2 encoder and head; `simbav2_lora` puts adapters on the `lora_layers` it names."""
    where = set(cfg.lora_layers) if cfg.family == "simbav2_lora" else set()
    lora = _lora_kwargs(cfg, cfg.weight_norm)
    e = cfg.num_members
    return nn.Sequential(
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


register_critic_family("mlp", _build_mlp)
register_critic_family("simbav2", _build_simbav2)
register_critic_family("simbav2_lora", _build_simbav2, _validate_lora, lambda cfg: [cfg.width])
register_critic_family(
    "mlp_lora", _build_mlp_lora, _validate_lora, lambda cfg: list(cfg.hidden_dims)
)


class TwinCritic(nn.Module):
    """`num_members` Q-networks on `concat(obs, action)`, evaluated as one batched computation;
    the network comes from the `critic.family` row of `CRITIC_FAMILIES`."""

    def __init__(self, obs_dim: int, action_dim: int, num_atoms: int, cfg: CriticConfig) -> None:
        super().__init__()
        cfg.check()
        validate_critic_config(cfg)  # the family's rules, before its builder runs
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.num_atoms = num_atoms
        self.num_members = cfg.num_members
        self.family = cfg.family
        self.net: nn.Module = CRITIC_FAMILIES[cfg.family].build(
            cfg, obs_dim + action_dim, num_atoms
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


def critic_adapted_widths(cfg: CriticConfig) -> list[int] | None:
    """The widths the LoRA rank must stay below, or None for a family without adapters."""
    family = CRITIC_FAMILIES.get(cfg.family)
    return None if family is None or family.adapted_widths is None else family.adapted_widths(cfg)
