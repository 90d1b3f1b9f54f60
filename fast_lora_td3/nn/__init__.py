"""fast_lora_td3.nn: ensemble layers, LoRA, SimbaV2, critics and actors (docs/DESIGN.md, nn/)."""

from fast_lora_td3.nn.actor import DeterministicActor, TanhGaussianActor, build_actor
from fast_lora_td3.nn.config import ActorConfig, CriticConfig
from fast_lora_td3.nn.critic import (
    CRITIC_FAMILIES,
    CriticFamily,
    TwinCritic,
    build_critic,
    register_critic_family,
)
from fast_lora_td3.nn.distributional import C51Support, expected_value, project_distribution
from fast_lora_td3.nn.layers import (
    EnsembleLayerNorm,
    EnsembleLinear,
    ensemble_linear,
    l2_normalize,
    project_weights_,
)
from fast_lora_td3.nn.lora import (
    LoRALinear,
    adapter_parameters,
    dense_trainable_parameters,
    lora_layers,
    merge_lora_,
)
from fast_lora_td3.nn.normalizer import EmpiricalNormalizer
from fast_lora_td3.nn.simbav2 import (
    HyperDense,
    LerpBlock,
    Scaler,
    SimbaV2Embedder,
    SimbaV2Encoder,
    SimbaV2Head,
)

__all__ = [
    "CRITIC_FAMILIES",
    "ActorConfig",
    "C51Support",
    "CriticConfig",
    "CriticFamily",
    "DeterministicActor",
    "EmpiricalNormalizer",
    "EnsembleLayerNorm",
    "EnsembleLinear",
    "HyperDense",
    "LerpBlock",
    "LoRALinear",
    "Scaler",
    "SimbaV2Embedder",
    "SimbaV2Encoder",
    "SimbaV2Head",
    "TanhGaussianActor",
    "TwinCritic",
    "adapter_parameters",
    "build_actor",
    "build_critic",
    "dense_trainable_parameters",
    "ensemble_linear",
    "expected_value",
    "l2_normalize",
    "lora_layers",
    "merge_lora_",
    "project_distribution",
    "project_weights_",
    "register_critic_family",
]
