"""The NaN/Inf guard of the training loop: running finite flags and the debug checkpoint.

Observations and rewards are checked on the device at every step into running flags; the host reads
them, with the window's summed losses, once every `nan_check_interval` iterations (one read instead of
one per step). On a non-finite value: `nan_action=skip` warns and training continues; `stop` writes a
debug checkpoint (rank 0) and raises NonFiniteError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.envs.base import StepResult
from fast_lora_td3.errors import NonFiniteError
from fast_lora_td3.runs.checkpoint import CheckpointManager


class FiniteGuard:
    """Watches one training run for non-finite observations, rewards and losses.

    `checkpoints`: where the debug checkpoint goes (None: write none, as on ranks other than 0);
    `state`: builds the training state to write there.
    """

    def __init__(
        self,
        interval: int,
        action: str,
        num_envs: int,
        device: torch.device,
        checkpoints: CheckpointManager | None,
        state: Callable[[], dict[str, Any]],
    ) -> None:
        self.interval, self.action, self.num_envs, self.device = interval, action, num_envs, device
        self.checkpoints, self.state = checkpoints, state
        self.flags = self._fresh_flags()

    def _fresh_flags(self) -> dict[str, Tensor]:
        true = torch.ones((), dtype=torch.bool, device=self.device)
        return {"observations": true.clone(), "rewards": true.clone()}

    def observe(
        self, iteration: int, result: StepResult, losses: Callable[[], dict[str, Tensor]]
    ) -> None:
        """Fold `result` into the flags; every `interval` iterations, check them and `losses()`."""
        if not self.interval:
            return
        # Device-side running flags: every step is covered, the host reads every N steps.
        self.flags["observations"] &= torch.isfinite(result.obs).all()
        self.flags["rewards"] &= torch.isfinite(result.reward).all()
        if iteration % self.interval == 0:
            watched = dict(self.flags)
            watched.update(losses())
            self.check(iteration, watched)
            self.flags = self._fresh_flags()

    def check(self, iteration: int, tensors: dict[str, Tensor]) -> None:
        """One host read: warn (skip) or write the debug checkpoint and raise (stop) when a tensor
        holds a non-finite value (a bool tensor: a False flag)."""
        names = list(tensors)
        flags = torch.stack(
            [
                t.all() if t.dtype == torch.bool else torch.isfinite(t).all()
                for t in tensors.values()
            ]
        ).tolist()
        for name, ok in zip(names, flags, strict=True):
            if not ok:
                err = NonFiniteError(name, iteration * self.num_envs)
                if self.action == "skip":
                    print(f"warning: {err} (nan_action=skip: continuing)", flush=True)
                    return
                if self.checkpoints is not None:
                    debug = self.checkpoints.debug_path_for(iteration)
                    self.checkpoints.save_as(self.state(), debug)
                raise err
