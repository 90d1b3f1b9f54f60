"""Data-parallel training over `torch.distributed` (SPEC §9), launched by torchrun or Slurm srun.

Each rank owns its envs and replay buffer; the gradients of one update are all-reduced as ONE
flattened bucket; normaliser statistics are all-reduced; rank 0 logs and checkpoints.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

DEFAULT_TIMEOUT_S = 300
"""Collective timeout: a dead rank ends the job with an error instead of a hang."""


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


@dataclass
class DistributedContext:
    """Rank, world size and device of this process; a single process when not launched in parallel."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @classmethod
    def from_environment(cls, device: str, timeout_s: int | None = None) -> DistributedContext:
        """Read torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or srun (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)
        variables; initialise the process group (NCCL on CUDA, gloo on CPU) when world_size > 1."""
        world = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1)
        if world <= 1:
            return cls(device=device)
        rank = _env_int("RANK", "SLURM_PROCID", default=0)
        local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(local_rank)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        timeout = timeout_s or int(
            os.environ.get("FAST_LORA_TD3_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)
        )
        if not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if device.startswith("cuda") else "gloo",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout),
            )
        return cls(rank=rank, world_size=world, local_rank=local_rank, device=device)

    def allreduce_grads_(self, params: list[Tensor]) -> None:
        """Average the gradients of `params` across ranks with one flattened all-reduce."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n

    def broadcast_module_(self, module: torch.nn.Module) -> None:
        """Make every rank start from rank 0's parameters and buffers."""
        if not self.enabled:
            return
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def broadcast_path(self, path: Path) -> Path:
        """Rank 0's run directory, shared with every rank."""
        if not self.enabled:
            return path
        obj = [str(path)]
        dist.broadcast_object_list(obj, src=0)
        return Path(obj[0])

    def shutdown(self) -> None:
        """Destroy the process group (if this process made one)."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
