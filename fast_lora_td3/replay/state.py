"""The replay buffer's checkpoint contents: its storage tensors, its write position and the geometry
that a buffer must match to take them back (`ReplayBuffer.state_dict` / `load_state_dict`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.errors import CheckpointError

ReplayBufferLike = Any
"""A `fast_lora_td3.replay.buffer.ReplayBuffer` (not imported: replay imports this module)."""

__all__ = ["load_replay_state", "replay_state", "replay_tensors"]

_TENSOR_NAMES = (
    "obs",
    "critic_obs",
    "actions",
    "rewards",
    "flags",
    "slot",
    "final_obs",
    "final_critic_obs",
    "final_owner",
    "final_count",
    "stale_until",
    "ptr",
)


def replay_tensors(rb: ReplayBufferLike) -> dict[str, Tensor]:
    """Every state tensor of `rb` by name (the critic-observation tables only when stored)."""
    return {k: getattr(rb, k) for k in _TENSOR_NAMES if getattr(rb, k) is not None}


def _meta(rb: ReplayBufferLike) -> dict[str, object]:
    return {
        "num_envs": rb.num_envs,
        "capacity_per_env": rb.capacity,
        "obs_dim": rb.obs_dim,
        "action_dim": rb.action_dim,
        "critic_obs_dim": rb.critic_obs_dim,
        "final_obs_slots": rb.final_obs_slots,
        "obs_dtype": str(rb.obs_dtype).removeprefix("torch."),
        "action_dtype": str(rb.action_dtype).removeprefix("torch."),
        "num_added": rb.num_added,
    }


def replay_state(rb: ReplayBufferLike) -> dict[str, object]:
    """Storage tensors (on device, not copied), pointers and geometry metadata."""
    return {"meta": _meta(rb), **replay_tensors(rb)}


@torch.no_grad()
def load_replay_state(rb: ReplayBufferLike, state: dict[str, object]) -> int:
    """Copy `state` into `rb`'s tensors in place (their addresses are kept, so captured graphs stay
    valid); returns the saved `num_added`. CheckpointError when the geometry differs."""
    meta: dict[str, object] = state["meta"]  # type: ignore[assignment]
    diff = [
        f"{k}={meta.get(k)!r} (buffer has {v!r})"
        for k, v in _meta(rb).items()
        if k != "num_added" and meta.get(k) != v
    ]
    if diff:
        raise CheckpointError(f"replay snapshot does not match this buffer: {', '.join(diff)}")
    for name, dst in replay_tensors(rb).items():
        dst.copy_(state[name])  # type: ignore[arg-type]
    return int(meta["num_added"])  # type: ignore[call-overload]
