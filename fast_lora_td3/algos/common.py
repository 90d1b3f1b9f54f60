"""Pieces shared by the learners: LoRA-aware target networks, merged-weight Polyak, param groups."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from fast_lora_td3.nn.layers import EnsembleLayerNorm
from fast_lora_td3.nn.lora import (
    LoRALinear,
    adapter_parameters,
    dense_trainable_parameters,
    lora_layers,
    merge_lora_,
)
from fast_lora_td3.nn.simbav2 import Scaler


def make_target(online: nn.Module) -> nn.Module:
    """A frozen copy of `online` whose LoRA layers hold the merged effective weight (target B = 0).

    A LoRA target is then a dense target: its base is Polyak-averaged in weight space (the mean of
    two low-rank updates is not low-rank, so the target cannot keep separate adapters).
    """
    target = copy.deepcopy(online)
    merge_lora_(target)
    target.requires_grad_(False)
    return target


class PolyakUpdater:
    """`target ← τ·online + (1 − τ)·target` with fused `_foreach` ops.

    Dense parameters are mixed directly. For LoRA layers the *effective* weights are mixed:
    `W'_base ← τ·W_eff + (1 − τ)·W'_base` with the target's B kept at zero, which equals the Polyak
    mix of the effective weights (the mean of two low-rank updates is not low-rank, so mixing A and B
    separately would be wrong).
    """

    def __init__(self, online: nn.Module, target: nn.Module) -> None:
        # The parameter lists are built once: the step itself is two fused kernels per call.
        self.online_layers, target_layers = lora_layers(online), lora_layers(target)
        if len(self.online_layers) != len(target_layers):
            raise ValueError("the target must mirror the online network's LoRA layers")
        if any(not layer.merged for layer in target_layers):
            # An unmerged target's own B would be added on top of the mixed base.
            raise ValueError("PolyakUpdater needs a merged target: build it with make_target")
        self.target_bases = [layer.base_weight for layer in target_layers]
        adapters = {id(p) for layer in self.online_layers for p in layer.lora_parameters()}
        target_named = dict(target.named_parameters())
        # Adapters reach the target through the merged weight; everything else is mixed directly.
        pairs = [
            (p, target_named[n]) for n, p in online.named_parameters() if id(p) not in adapters
        ]
        self.online_params = [p for p, _ in pairs]
        self.target_params = [t for _, t in pairs]

    @torch.no_grad()
    def update(self, tau: float) -> None:
        """Apply one Polyak step (no host synchronisation)."""
        if self.target_params:
            torch._foreach_lerp_(self.target_params, [p.detach() for p in self.online_params], tau)
        if self.online_layers:
            effective = [layer.effective_weight().detach() for layer in self.online_layers]
            torch._foreach_lerp_(self.target_bases, effective, tau)


# Parameters of these modules are scales and shifts (SimbaV2 Scalers, LayerNorm affine): decaying
# them toward zero changes what the network computes, so they are never decayed (nor any bias).
_NO_DECAY_MODULES = (Scaler, EnsembleLayerNorm, nn.LayerNorm)


def split_weight_decay(module: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Trainable non-adapter parameters of a module split into (decayed, not decayed).

    Not decayed: every Scaler and LayerNorm parameter and every bias. Decayed: the weights of
    linears (dense HyperDense weights too: their row projection undoes the decay, as in the
    official SimbaV2, which uses no decay at all). LoRA adapters are in neither list.
    """
    adapters = {id(p) for p in adapter_parameters(module)}
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for sub in module.modules():
        for name, p in sub.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in adapters:
                continue
            keep = isinstance(sub, _NO_DECAY_MODULES) or name == "bias"
            (no_decay if keep else decay).append(p)
    return decay, no_decay


def param_groups(
    module: nn.Module, weight_decay: float, adapter_weight_decay: float | None = None
) -> list[dict]:
    """Named AdamW groups (empty groups dropped).

    Without adapters: `decay` (linear weights, `weight_decay`) and `no_decay` (Scalers, norms,
    biases: 0). With adapters: `adapters` (`adapter_weight_decay`) and `dense` (every other
    trainable parameter: 0, the adapters carry the regularisation). Frozen bases are buffers, so
    they are in no group.
    """
    adapters = adapter_parameters(module)
    if adapters:
        groups = [
            {"name": "adapters", "params": adapters, "weight_decay": adapter_weight_decay or 0.0},
            {"name": "dense", "params": dense_trainable_parameters(module), "weight_decay": 0.0},
        ]
    else:
        decay, no_decay = split_weight_decay(module)
        groups = [
            {"name": "decay", "params": decay, "weight_decay": weight_decay},
            {"name": "no_decay", "params": no_decay, "weight_decay": 0.0},
        ]
    return [g for g in groups if g["params"]]


def make_adamw(
    groups: list[dict], lr: float, betas: Iterable[float], device: torch.device
) -> torch.optim.AdamW:
    """AdamW with the fused kernel where the device has one (CUDA and CPU: one pass over each
    tensor instead of a dozen `_foreach` passes, ~10x faster on CPU), `foreach` otherwise."""
    fused = device.type in _get_fused_kernels_supported_devices()
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), fused=fused, foreach=None if fused else True
    )


# Implementation flags of an optimiser group: properties of this run's update mode, not of the
# checkpoint an optimiser state came from.
_IMPL_KEYS = ("fused", "foreach", "capturable")


def load_optimizer_state_(opt: torch.optim.Optimizer, state: dict) -> None:
    """`opt.load_state_dict(state)`, keeping this run's implementation flags and LR tensors.

    A tensor LR (compiled / captured update steps) stays the same tensor object, filled with the
    loaded value, so compiled code and captured graphs keep reading it; a float LR stays a float.
    """
    before = [{k: g[k] for k in ("lr", *_IMPL_KEYS) if k in g} for g in opt.param_groups]
    opt.load_state_dict(state)
    for group, old in zip(opt.param_groups, before, strict=True):
        group.update({k: old[k] for k in _IMPL_KEYS if k in old})
        lr, old_lr = group["lr"], old["lr"]
        if isinstance(old_lr, torch.Tensor):
            old_lr.fill_(float(lr))
            group["lr"] = old_lr
        else:
            group["lr"] = float(lr)
        capturable = group.get("capturable") or group.get("fused")
        for p in group["params"]:
            step = opt.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                # fused / capturable kernels read the step on the parameter's device, others on CPU
                where = p.device if capturable else torch.device("cpu")
                opt.state[p]["step"] = step.to(device=where, dtype=torch.float32)


def effective_rank(weight: torch.Tensor) -> torch.Tensor:
    """exp(entropy of the normalised singular values), averaged over a leading ensemble axis."""
    s = torch.linalg.svdvals(weight.float())
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
    return entropy.exp().mean()


@torch.no_grad()
def adapter_norms(module: nn.Module, ranks: bool = True) -> dict[str, torch.Tensor]:
    """Frobenius norm and effective rank of every LoRA ΔW (device tensors; read at logging time)."""
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, LoRALinear):
            delta = m.delta_weight()
            out[f"lora/{name}/delta_norm"] = delta.norm()
            if ranks:
                out[f"lora/{name}/effective_rank"] = effective_rank(delta)
    return out
