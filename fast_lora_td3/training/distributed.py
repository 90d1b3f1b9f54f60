"""Data-parallel training over `torch.distributed`, launched by torchrun or Slurm srun.

Each rank owns its envs and replay buffer; the gradients of one update are all-reduced as ONE
flattened bucket; normaliser statistics are all-reduced; rank 0 logs, checkpoints and exports.
A collective timeout (FAST_LORA_TD3_DIST_TIMEOUT_S, default 300 s) turns a dead rank into an error.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fast_lora_td3.envs.launch import env_int, world_size_from_environment
from fast_lora_td3.errors import ConfigError

if TYPE_CHECKING:
    from fast_lora_td3.algos.base import OffPolicyLearner

DEFAULT_TIMEOUT_S = 300
"""Collective timeout: a dead rank ends the job with an error instead of a hang."""
TIMEOUT_ENV = "FAST_LORA_TD3_DIST_TIMEOUT_S"
"""Environment variable overriding DEFAULT_TIMEOUT_S (seconds)."""
DUMP_ENV = "FAST_LORA_TD3_DUMP_PARAMS_DIR"
"""When set, every rank writes its final learner tensors to `<dir>/rank<r>.pt` (replica checks)."""


def tensor_fingerprint(tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 of the names, dtypes, shapes and exact bytes of `tensors` (order-independent)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def module_tensors(modules: Mapping[str, nn.Module | Tensor]) -> dict[str, Tensor]:
    """Every parameter and buffer of `modules`, keyed `<module>.<state key>` (a bare tensor such
    as FastSAC's log α is kept under its own name)."""
    out: dict[str, Tensor] = {}
    for m_name, module in modules.items():
        if isinstance(module, Tensor):
            out[m_name] = module
            continue
        for key, value in module.state_dict().items():
            out[f"{m_name}.{key}"] = value
    return out


def replica_state(learner: OffPolicyLearner) -> dict[str, nn.Module | Tensor]:
    """What must be identical on every rank: the learner's modules and free tensors (FastSAC α)."""
    state: dict[str, nn.Module | Tensor] = dict(learner.modules())
    state.update(learner.free_tensors())
    return state


@dataclass
class DistributedContext:
    """Rank, world size and device of this process; a single process when not launched in parallel."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"
    timeout_s: int = DEFAULT_TIMEOUT_S

    @property
    def enabled(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes files (run dir, logs, checkpoints, export)."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: str, timeout_s: int | None = None) -> DistributedContext:
        """Read torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or srun (SLURM_PROCID/SLURM_STEP_NUM_TASKS/
        SLURM_LOCALID) variables; initialise the process group (NCCL on CUDA, gloo on CPU) when
        world_size > 1."""
        world = world_size_from_environment()
        if world <= 1:
            return cls(device=device)
        rank = env_int("RANK", "SLURM_PROCID", default=0)
        local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
        if "MASTER_ADDR" not in os.environ:
            if env_int("SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1) > 1:
                raise ConfigError(
                    "srun over several nodes needs MASTER_ADDR: export MASTER_ADDR=$(scontrol show "
                    "hostnames $SLURM_JOB_NODELIST | head -n 1) (or launch with torchrun)"
                )
            os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ.setdefault("MASTER_PORT", "29500")
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(local_rank)
        timeout = timeout_s or env_int(TIMEOUT_ENV, default=DEFAULT_TIMEOUT_S)
        if not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if device.startswith("cuda") else "gloo",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout),
            )
        return cls(rank, world, local_rank, device, timeout)

    def failure_message(self, exc: BaseException) -> str:
        """One line explaining a failed collective on this rank."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"rank {self.rank} of {self.world_size}: a collective failed ({first[:300]}); another "
            f"rank died or did not answer within the {self.timeout_s} s timeout ({TIMEOUT_ENV}); "
            f"see the other ranks' logs"
        )

    def allreduce_grads_(self, params: list[Tensor]) -> None:
        """Average the gradients of `params` across ranks with one flattened all-reduce.

        A parameter without a gradient on this rank contributes zeros (and receives the average).
        """
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

    def broadcast_module_(self, module: nn.Module) -> None:
        """Make every rank start from rank 0's parameters and buffers."""
        if not self.enabled:
            return
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def broadcast_path(self, path: Path | None) -> Path:
        """Rank 0's run directory, shared with every rank (other ranks may pass None)."""
        if not self.enabled:
            assert path is not None
            return path
        obj = [str(path) if self.is_main else None]
        dist.broadcast_object_list(obj, src=0)
        return Path(obj[0])  # type: ignore[arg-type]

    def any_true(self, flag: bool) -> bool:
        """True when `flag` is true on any rank (one tiny all-reduce; a host sync)."""
        if not self.enabled:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def check_replicas_in_sync(self, modules: Mapping[str, nn.Module | Tensor]) -> str:
        """Compare every rank's parameter/buffer fingerprint; raise RuntimeError naming the ranks
        that diverged from rank 0. Returns the (common) fingerprint."""
        fingerprint = tensor_fingerprint(module_tensors(modules))
        if not self.enabled:
            return fingerprint
        gathered: list[str | None] = [None] * self.world_size
        dist.all_gather_object(gathered, fingerprint)
        bad = [r for r, f in enumerate(gathered) if f != gathered[0]]
        if bad:
            raise RuntimeError(f"data-parallel replicas diverged: ranks {bad} differ from rank 0")
        return fingerprint

    def dump_parameters(self, modules: Mapping[str, nn.Module | Tensor]) -> Path | None:
        """Write this rank's learner tensors to `$FAST_LORA_TD3_DUMP_PARAMS_DIR/rank<r>.pt` when
        the variable is set (a debugging aid for checking replicas); returns the path."""
        directory = os.environ.get(DUMP_ENV)
        if not directory:
            return None
        path = Path(directory) / f"rank{self.rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in module_tensors(modules).items()}, path)
        return path

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process): ranks then tear the group down together."""
        if self.enabled:
            dist.barrier()

    def shutdown(self) -> None:
        """Destroy the process group (if this process made one)."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
