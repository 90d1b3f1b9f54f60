"""Typed, documented network configs (Hydra structured configs: unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CriticConfig:
    """Twin distributional critic. `family` selects the architecture (SPEC §2.1, §2.3, §2.4)."""

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
