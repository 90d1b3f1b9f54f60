"""Typed, documented network configs (Hydra structured configs: unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fast_lora_td3.errors import ConfigError

ACTOR_FAMILIES = ("mlp", "simbav2")
"""Valid values of `ActorConfig.family`."""
MLP_ACTIVATIONS = ("relu", "silu_layernorm")
"""Valid values of `activation` (critic and actor MLPs)."""
LORA_INITS = ("paper", "zero_b")
"""Valid values of `CriticConfig.lora_init`."""
WEIGHT_NORMS = ("none", "project", "forward")
"""Valid values of `CriticConfig.weight_norm`."""


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{name}={value} must be a positive integer")


def _check_widths(name: str, dims: list[int]) -> None:
    if not dims or any(d < 1 for d in dims):
        raise ConfigError(f"{name}={list(dims)} must be a non-empty list of positive ints")


@dataclass
class CriticConfig:
    """Twin distributional critic. `family` selects the architecture."""

    family: str = "mlp"
    """A key of `nn.critic.CRITIC_FAMILIES` (a plain str, not a Literal, so `register_critic_family`
    can add one): built in `mlp`, `simbav2`, `simbav2_lora`, `mlp_lora`."""
    hidden_dims: list[int] = field(default_factory=lambda: [1024, 512, 256])
    """Hidden widths of the `mlp` / `mlp_lora` families (FastTD3 recipe: 1024-512-256)."""
    activation: str = "relu"
    """MLP style: `relu` (FastTD3) or `silu_layernorm` (FastSAC: Linear → LayerNorm → SiLU)."""
    width: int = 512
    """Hidden width `h` of the `simbav2` / `simbav2_lora` families."""
    num_blocks: int = 2
    """Number of SimbaV2 LERP residual blocks."""
    c_shift: float = 3.0
    """Constant appended to the normalised input by the SimbaV2 embedder."""
    rank: int = 96
    """LoRA rank r of the `*_lora` families; must satisfy 0 < r < min(in, out) of every adapted layer."""
    alpha: float | None = None
    """LoRA scale numerator: ΔW is scaled by alpha / rank. None means alpha = rank (scale 1)."""
    lora_init: str = "paper"
    """`paper` (A, B normal, rows rescaled by kernel_init_scale) or `zero_b` (B = 0: ΔW starts at 0;
    needs weight_norm `forward` or `none`, since LoRA-WN has no well-defined scale for ΔW = 0)."""
    kernel_init_scale: float = 0.5
    """κ: the paper init rescales each base row and each initial ΔW row to norm √κ. Must be < 1 with
    weight_norm=project (base rows strictly inside the unit sphere give LoRA-WN a unique root)."""
    lora_layers: list[str] = field(default_factory=lambda: ["blocks"])
    """Which linears get adapters. simbav2_lora: any of `blocks` (W1, W2 of every block), `embedder`,
    `head`. mlp_lora: `hidden` (every linear but the output layer) or `all`."""
    weight_norm: str = "project"
    """LoRA-WN for simbav2_lora: `project` (rescale B's columns after each step so effective rows are
    unit norm), `forward` (row-normalise W_eff in the forward pass) or `none`."""
    num_members: int = 2
    """Number of Q-networks evaluated as one batched computation (2 = twin critics)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of single fields; the family's own rules (its name, which layers a LoRA
        family adapts, LoRA-WN compatibility) live in its row of `nn.critic.CRITIC_FAMILIES`."""
        _check_positive("critic.num_members", self.num_members)
        if self.activation not in MLP_ACTIVATIONS:
            raise ConfigError(
                f"critic.activation={self.activation!r} is invalid; choose one of {MLP_ACTIVATIONS}"
            )
        _check_widths("critic.hidden_dims", self.hidden_dims)
        _check_positive("critic.width", self.width)
        _check_positive("critic.num_blocks", self.num_blocks)
        if self.lora_init not in LORA_INITS:
            raise ConfigError(
                f"critic.lora_init={self.lora_init!r} is invalid; choose one of {LORA_INITS}"
            )
        if self.weight_norm not in WEIGHT_NORMS:
            raise ConfigError(
                f"critic.weight_norm={self.weight_norm!r} is invalid; choose one of {WEIGHT_NORMS}"
            )
        _check_positive("critic.rank", self.rank)
        if self.kernel_init_scale <= 0:
            raise ConfigError(f"critic.kernel_init_scale={self.kernel_init_scale} must be > 0")


@dataclass
class ActorConfig:
    """Actor network; the head (deterministic TD3 or tanh-Gaussian SAC) follows the algorithm."""

    family: str = "mlp"
    """`mlp` or `simbav2`."""
    hidden_dims: list[int] = field(default_factory=lambda: [512, 256, 128])
    """Hidden widths of the `mlp` family (FastTD3 / FastSAC recipe: 512-256-128)."""
    activation: str = "relu"
    """`relu` (FastTD3) or `silu_layernorm` (FastSAC)."""
    width: int = 256
    """Hidden width of the `simbav2` family."""
    num_blocks: int = 1
    """Number of SimbaV2 blocks of the `simbav2` family."""
    c_shift: float = 3.0
    """SimbaV2 embedder shift."""
    last_layer_std: float = 0.01
    """TD3, MLP family: std of the normal init of the last layer (MLP SAC heads are zero-initialised;
    SimbaV2 heads have unit-norm rows and a zero bias)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError (one line naming the setting and the valid values) on a bad config."""
        if self.family not in ACTOR_FAMILIES:
            raise ConfigError(
                f"actor.family={self.family!r} is invalid; choose one of {ACTOR_FAMILIES}"
            )
        if self.family == "mlp":
            if self.activation not in MLP_ACTIVATIONS:
                raise ConfigError(
                    f"actor.activation={self.activation!r} is invalid; choose 'relu' or 'silu_layernorm'"
                )
            _check_widths("actor.hidden_dims", self.hidden_dims)
        else:
            _check_positive("actor.width", self.width)
            _check_positive("actor.num_blocks", self.num_blocks)
        if self.last_layer_std < 0:
            raise ConfigError(f"actor.last_layer_std={self.last_layer_std} must be >= 0")
