"""How far training moved a network's weight matrices from their initial values (reported by
the LoRA-vs-dense comparison).

For a LoRA layer the weight the layer computes with is `effective_weight()` (frozen base + ΔW,
row-normalised per its weight_norm), so the change is measured on that, not on the adapters: it
compares directly with a dense layer's `weight` at the same width. Biases, norms and scalers are
not weight matrices and are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fast_lora_td3.nn.layers import EnsembleLinear
from fast_lora_td3.nn.lora import LoRALinear


def weight_matrices(module: nn.Module) -> dict[str, Tensor]:
    """Every weight matrix of `module`'s linear layers as used in the forward pass, by module name."""
    out: dict[str, Tensor] = {}
    for name, m in module.named_modules():
        if isinstance(m, LoRALinear):
            out[name] = m.effective_weight()
        elif isinstance(m, EnsembleLinear | nn.Linear):
            out[name] = m.weight
    return out


@torch.no_grad()
def weight_snapshot(module: nn.Module) -> dict[str, Tensor]:
    """Detached copies of `weight_matrices(module)` (call at initialisation)."""
    return {k: v.detach().clone() for k, v in weight_matrices(module).items()}


@torch.no_grad()
def weight_change_norms(module: nn.Module, initial: dict[str, Tensor]) -> dict[str, Tensor]:
    """`critic/weight_change_norm`: ‖W − W₀‖ over all matrices together (Frobenius), and
    `critic/weight_change_rel`: that divided by ‖W₀‖. Device tensors; read at logging time."""
    current = weight_matrices(module)
    if not current:
        return {}
    diff_sq = sum(((current[k].float() - initial[k].float()) ** 2).sum() for k in current)
    init_sq = sum((initial[k].float() ** 2).sum() for k in current)
    diff = torch.as_tensor(diff_sq).sqrt()
    return {
        "critic/weight_change_norm": diff,
        "critic/weight_change_rel": diff / torch.as_tensor(init_sq).sqrt().clamp_min(1e-12),
    }
