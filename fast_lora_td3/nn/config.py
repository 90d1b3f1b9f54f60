"""Typed, documented network configs (Hydra structured configs: unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass

from fast_lora_td3.fields import check_fields, setting

ACTOR_FAMILIES = ("mlp", "simbav2")
"""Valid values of `ActorConfig.family`."""
MLP_ACTIVATIONS = ("relu", "silu_layernorm")
"""Valid values of `activation` (critic and actor MLPs)."""
LORA_INITS = ("paper", "zero_b")
"""Valid values of `CriticConfig.lora_init`."""
WEIGHT_NORMS = ("none", "project", "forward")
"""Valid values of `CriticConfig.weight_norm`."""


@dataclass
class CriticConfig:
    """Twin distributional critic. `family` selects the architecture."""

    family: str = setting("mlp", what="a critic family of nn/critic.py")
    """A key of `nn.critic.CRITIC_FAMILIES` (a plain str, not a Literal, so `register_critic_family`
    can add one): built in `mlp`, `simbav2`, `simbav2_lora`, `mlp_lora`."""
    hidden_dims: list[int] = setting(factory=lambda: [1024, 512, 256], min_len=1, ge=1)
    """Hidden widths of the `mlp` / `mlp_lora` families (FastTD3 recipe: 1024-512-256)."""
    activation: str = setting("relu", choices=MLP_ACTIVATIONS)
    """MLP style: `relu` (FastTD3) or `silu_layernorm` (FastSAC: Linear → LayerNorm → SiLU)."""
    width: int = setting(512, ge=1)
    """Hidden width `h` of the `simbav2` / `simbav2_lora` families."""
    num_blocks: int = setting(2, ge=1)
    """Number of SimbaV2 LERP residual blocks."""
    c_shift: float = 3.0
    """Constant appended to the normalised input by the SimbaV2 embedder."""
    rank: int = setting(96, ge=1)
    """LoRA rank r of the `*_lora` families; must satisfy 0 < r < min(in, out) of every adapted layer."""
    alpha: float | None = setting(None, gt=0)
    """LoRA scale numerator: ΔW is scaled by alpha / rank. None means alpha = rank (scale 1)."""
    lora_init: str = setting("paper", choices=LORA_INITS)
    """`paper` (A, B normal, rows rescaled by kernel_init_scale) or `zero_b` (B = 0: ΔW starts at 0;
    needs weight_norm `forward` or `none`, since LoRA-WN has no well-defined scale for ΔW = 0)."""
    kernel_init_scale: float = setting(0.5, gt=0)
    """κ: the paper init rescales each base row and each initial ΔW row to norm √κ. Must be < 1 with
    weight_norm=project (base rows strictly inside the unit sphere give LoRA-WN a unique root)."""
    lora_layers: list[str] = setting(factory=lambda: ["blocks"], min_len=1)
    """Which linears get adapters. simbav2_lora: any of `blocks` (W1, W2 of every block), `embedder`,
    `head`. mlp_lora: `hidden` (every linear but the output layer) or `all`."""
    weight_norm: str = setting("project", choices=WEIGHT_NORMS)
    """LoRA-WN for simbav2_lora: `project` (rescale B's columns after each step so effective rows are
    unit norm), `forward` (row-normalise W_eff in the forward pass) or `none`."""
    num_members: int = setting(2, ge=1)
    """Number of Q-networks evaluated as one batched computation (2 = twin critics)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of single fields; the family's own rules (its name, which layers a LoRA
        family adapts, LoRA-WN compatibility) live in its row of `nn.critic.CRITIC_FAMILIES`."""
        check_fields(self, "critic")


@dataclass
class ActorConfig:
    """Actor network; the head (deterministic TD3 or tanh-Gaussian SAC) follows the algorithm."""

    family: str = setting("mlp", choices=ACTOR_FAMILIES)
    """`mlp` or `simbav2`."""
    hidden_dims: list[int] = setting(factory=lambda: [512, 256, 128], min_len=1, ge=1)
    """Hidden widths of the `mlp` family (FastTD3 / FastSAC recipe: 512-256-128)."""
    activation: str = setting("relu", choices=MLP_ACTIVATIONS)
    """`relu` (FastTD3) or `silu_layernorm` (FastSAC)."""
    width: int = setting(256, ge=1)
    """Hidden width of the `simbav2` family."""
    num_blocks: int = setting(1, ge=1)
    """Number of SimbaV2 blocks of the `simbav2` family."""
    c_shift: float = 3.0
    """SimbaV2 embedder shift."""
    last_layer_std: float = setting(0.01, ge=0)
    """TD3, MLP family: std of the normal init of the last layer (MLP SAC heads are zero-initialised;
    SimbaV2 heads have unit-norm rows and a zero bias)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError (one line naming the setting and the valid values) on a bad config."""
        check_fields(self, "actor")
