"""Preemption: SIGTERM / SIGUSR1 (Slurm `--signal=B:USR1@120`) noted when it arrives, acted upon at
the next iteration boundary, where the trainer checkpoints and exits for a requeue."""

from __future__ import annotations

import signal
from typing import Any

from fast_lora_td3.training.distributed import DistributedContext

STOP_SYNC_INTERVAL = 8
"""Data parallel: iterations between the ranks' agreement on a pending preemption signal."""


class PreemptionSignal:
    """The pending preemption signal of this process; `stop_due` says when all ranks stop."""

    def __init__(self, dist: DistributedContext) -> None:
        self.dist = dist
        self.signum: int | None = None
        """The signal received, if any."""

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signum = signum  # acted upon at the next step boundary

    def install(self) -> None:
        """Catch SIGTERM and SIGUSR1 (process-wide handlers)."""
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def stop_due(self, iteration: int) -> bool:
        """A preemption signal arrived; with several ranks, all agree every STOP_SYNC_INTERVAL
        iterations so they stop at the same step (none is left waiting in a collective)."""
        if not self.dist.enabled:
            return self.signum is not None
        if iteration % STOP_SYNC_INTERVAL:
            return False
        return self.dist.any_true(self.signum is not None)
