"""The logging window of the training loop: metric sums, the time split, rates, and when a row is due.

Update metrics stay on the device as running sums, so the host reads them once per metrics row, not
once per update. A row is due every `log_interval` iterations, after `log_interval_s` seconds, at an
evaluation and at the end; until the first training episode is logged, the trainer also polls for
one every `poll_s` seconds so a slow run shows its first return early.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

PHASES = ("env", "sample", "update")
"""The parts of an iteration timed separately (`time/<phase>_frac` in each row)."""


class MetricsWindow:
    """Sums, counts, timings and rates of the current logging window, for one training run."""

    def __init__(
        self, log_interval: int, log_interval_s: float, num_envs: int, poll_s: float
    ) -> None:
        self.log_interval, self.log_interval_s = log_interval, log_interval_s
        self.num_envs, self.poll_s = num_envs, poll_s
        self.sums: dict[str, Tensor] = {}
        """Device-side sum of each update metric over the window."""
        self.counts: dict[str, int] = {}
        """Number of updates summed into each metric."""
        self.timings = dict.fromkeys(PHASES, 0.0)
        """Wall seconds spent in each phase during the window."""
        self.start_time = self.last_poll = time.perf_counter()
        self.start_iteration = 0
        self.rows = 0
        """Rows closed so far in this run."""
        self.episode_logged = False
        """Whether a row has reported a finished training episode (ends the polling)."""
        self.last_row: dict[str, float] = {}
        """The last row written (the trainer's return value)."""

    def start(self, iteration: int) -> None:
        """Open the first window at `iteration` (the clock starts now)."""
        self.start_time = self.last_poll = time.perf_counter()
        self.start_iteration = iteration

    def add(self, metrics: dict[str, Tensor]) -> None:
        """Add one update's metrics (0-d tensors, kept on the device)."""
        for k, v in metrics.items():
            self.sums[k] = self.sums[k] + v if k in self.sums else v.clone()
            self.counts[k] = self.counts.get(k, 0) + 1

    def losses(self) -> dict[str, Tensor]:
        """The summed losses of the window (watched by the finite guard)."""
        return {k: v for k, v in self.sums.items() if k.endswith("loss")}

    def due(self, iteration: int, now: float, *, force: bool = False) -> bool:
        """Whether a row is due after `iteration` at time `now` (perf_counter seconds)."""
        due = iteration % self.log_interval == 0 or force
        return due or 0 < self.log_interval_s <= now - self.start_time

    def poll_due(self, now: float) -> bool:
        """Until the first training episode is logged: whether to look for one now (one host
        read every `poll_s` seconds)."""
        if self.episode_logged or now - self.last_poll < self.poll_s:
            return False
        self.last_poll = now
        return True

    def means(self) -> dict[str, float]:
        """Mean of each metric over the window (one host read)."""
        if not self.sums:
            return {}
        keys = list(self.sums)
        values = torch.stack([self.sums[k].float() / self.counts[k] for k in keys]).tolist()
        return dict(zip(keys, values, strict=True))

    def time_fractions(self) -> dict[str, float]:
        """Share of each phase in the window's timed host wall time. On CUDA the work is queued
        without host syncs, so its time lands where the host next waits: an H200 run bound by its
        graphed update showed `time/update_frac` 0.03 (docs/RESULTS.md, "On one H200")."""
        total = sum(self.timings.values()) or 1.0
        return {f"time/{k}_frac": v / total for k, v in self.timings.items()}

    def close(self, iteration: int) -> dict[str, float]:
        """The window's env-steps/s and updates/s; the next window starts at `iteration`."""
        elapsed = time.perf_counter() - self.start_time
        its = iteration - self.start_iteration
        rates = {
            "env_steps_per_s": its * self.num_envs / max(elapsed, 1e-9),
            "updates_per_s": self.counts.get("critic_loss", 0) / max(elapsed, 1e-9),
        }
        self.sums, self.counts = {}, {}
        self.timings = dict.fromkeys(self.timings, 0.0)
        self.start_time, self.start_iteration = time.perf_counter(), iteration
        self.rows += 1
        return rates


class ValueRangeWatch:
    """Warns once when the critic's targets keep piling onto an end atom of the support.

    Mass on an end atom means the projected targets were clipped there: the support cannot hold
    the task's returns, and the critic's values saturate silently. One line names the setting.
    """

    def __init__(
        self, support: tuple[float, float], auto: bool, threshold: float = 0.1, rows: int = 3
    ) -> None:
        self.support, self.auto = support, auto
        self.threshold, self.rows = threshold, rows
        self.streak = 0
        self.warned = False

    def check(self, row: dict[str, float]) -> str | None:
        """The warning line on the `rows`-th consecutive saturated row (once per run), else None."""
        low, high = row.get("value/end_mass_low"), row.get("value/end_mass_high")
        if low is None or high is None:
            return None  # no update in this row's window
        share = max(low, high)
        self.streak = self.streak + 1 if share > self.threshold else 0
        if self.warned or self.streak < self.rows:
            return None
        self.warned = True
        end = (
            f"algo.v_max={self.support[1]:g}" if high >= low else f"algo.v_min={self.support[0]:g}"
        )
        fix = (
            "raise algo.return_scale_max"
            if self.auto
            else "unset algo.v_min/algo.v_max for the automatic range, or widen them"
        )
        return (
            f"warning: {share:.0%} of the critic's target mass sits on the end atom {end} for "
            f"{self.streak} metrics rows: the value support is too narrow for this task's returns; "
            f"{fix}"
        )
