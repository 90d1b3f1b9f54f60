"""The one vectorised-environment protocol every backend implements, and what backends share.

All tensors live on the env device. ``StepResult.final_obs`` carries the *true* last observation of
an episode that ended on this step, so time-outs can bootstrap from it instead of from the first
observation of the next episode. Backends are pure adapters: episode statistics are kept by their
user (``EpisodeTracker``, owned by the collector), not by the env.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from fast_lora_td3.errors import ConfigError


@dataclass
class StepResult:
    """What one ``VecEnv.step`` returns; every tensor has leading dimension ``num_envs``."""

    obs: Tensor
    """[N, obs_dim] float32: next observation; for envs that finished, the first obs of the new episode."""
    critic_obs: Tensor
    """[N, critic_obs_dim] float32 (the same tensor as ``obs`` when the task has no critic group)."""
    reward: Tensor
    """[N] float32 reward of the step just taken."""
    terminated: Tensor
    """[N] bool: the episode ended in a terminal state (no bootstrap)."""
    truncated: Tensor
    """[N] bool: the episode was cut by a time limit (bootstrap from ``final_obs``)."""
    final_obs: Tensor
    """[N, obs_dim]: the true last observation for envs that finished, equal to ``obs`` elsewhere."""
    final_critic_obs: Tensor
    """[N, critic_obs_dim]: like ``final_obs`` for the critic group."""
    info: dict[str, Any] = field(default_factory=dict)
    """``"log"``: the simulator's ``extras["log"]`` for this step (backend-specific extras beside)."""


class EpisodeTracker:
    """Running per-env episode return/length, accumulated on device with no host sync per step.

    It lives here, below every user (collector, slice evaluation, the PPO adapter), so that none of
    them imports another; no backend holds one.

    ``update`` adds one step; finished episodes are summed into device accumulators, and ``pop``
    (called at logging intervals) reads them once and clears them.
    """

    def __init__(self, num_envs: int, device: torch.device | str) -> None:
        """Allocate per-env running sums and the finished-episode accumulators on ``device``."""
        self.device = torch.device(device)
        self.returns = torch.zeros(num_envs, dtype=torch.float32, device=self.device)
        self.lengths = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        # [sum of returns, sum of lengths, count] of episodes finished since the last pop().
        self._acc = torch.zeros(3, dtype=torch.float64, device=self.device)

    def reset(self) -> None:
        """Forget running episodes and finished-episode sums (after a full env reset)."""
        self.returns.zero_()
        self.lengths.zero_()
        self._acc.zero_()

    def update(self, reward: Tensor, done: Tensor) -> dict[str, Tensor]:
        """Add one step of ``reward`` [N]; ``done`` [N] bool marks episodes that ended on it.

        Returns per-env tensors ``{"return", "length", "done"}`` of the episodes that just ended
        (values are only meaningful where ``done`` is true); no host synchronisation.
        """
        self.returns += reward.to(torch.float32)
        self.lengths += 1
        done_f = done.to(torch.float64)
        finished = torch.stack(
            [
                (self.returns.to(torch.float64) * done_f).sum(),
                (self.lengths.to(torch.float64) * done_f).sum(),
                done_f.sum(),
            ]
        )
        self._acc += finished
        out = {"return": self.returns.clone(), "length": self.lengths.clone(), "done": done.clone()}
        # torch.where (not multiply) so a non-finite return cannot leak into the next episode.
        self.returns = torch.where(done, torch.zeros_like(self.returns), self.returns)
        self.lengths = torch.where(done, torch.zeros_like(self.lengths), self.lengths)
        return out

    def pop(self) -> dict[str, Tensor] | None:
        """Mean return/length (0-d float32 tensors) and count of episodes finished since the last pop.

        Returns ``None`` when none finished. Performs one host read (call at logging intervals).
        """
        acc = self._acc.clone()
        self._acc.zero_()
        count = float(acc[2].item())  # the single host read, at logging cadence only
        if count == 0.0:
            return None
        return {
            "mean_return": (acc[0] / acc[2]).to(torch.float32),
            "mean_length": (acc[1] / acc[2]).to(torch.float32),
            "count": acc[2].to(torch.float32),
        }


@runtime_checkable
class VecEnv(Protocol):
    """A batch of ``num_envs`` environments stepped together.

    ``step`` resets finished envs itself: ``obs`` is always the observation the policy acts on
    next, ``final_obs`` the true last observation of the finished episode. A backend class is built
    as ``cls(cfg: EnvConfig)`` and lists its tasks with ``cls.task_ids()`` (see ``envs.backends``).
    """

    num_envs: int
    obs_dim: int
    critic_obs_dim: int
    action_dim: int
    device: torch.device
    max_episode_length: int
    has_critic_obs: bool

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env; returns ``(obs, critic_obs)``."""
        ...

    def step(self, actions: Tensor) -> StepResult:
        """Apply ``actions`` [N, action_dim] in [-1, 1] and advance one control step."""
        ...

    def close(self) -> None:
        """Release the simulator."""
        ...

    def deployment_info(self) -> dict[str, Any]:
        """Best-effort facts for export (joint order, default pose, gains, dt, obs layout)."""
        ...


def as_float_obs(x: Tensor, num_envs: int) -> Tensor:
    """Flatten an observation to ``[num_envs, -1]`` float32 (histories and images included)."""
    return x.reshape(num_envs, -1).to(torch.float32)


def select_done(done: Tensor, when_done: Tensor, otherwise: Tensor) -> Tensor:
    """Row-wise ``where``: rows of ``when_done`` where ``done`` [N] is true, else ``otherwise``."""
    return torch.where(done.view(-1, *([1] * (otherwise.dim() - 1))), when_done, otherwise)


def group_tensor(group: Tensor | dict[str, Tensor], num_envs: int) -> Tensor:
    """An observation group as ``[N, -1]`` float32; a dict group (``concatenate_terms=False``) is
    flattened term by term in its order (mjlab and Isaac Lab hand out both kinds)."""
    if isinstance(group, dict):
        return torch.cat([as_float_obs(v, num_envs) for v in group.values()], dim=-1)
    return as_float_obs(group, num_envs)


def unknown_task_error(backend: str, task: str, valid: Iterable[str]) -> ConfigError:
    """A one-line ConfigError naming the unknown ``task`` and the closest registered ids."""
    valid = list(valid)
    close = difflib.get_close_matches(task, valid, n=5, cutoff=0.4)
    hint = f"did you mean one of {close}?" if close else f"{len(valid)} ids are registered"
    return ConfigError(f"env.task={task!r} is not a registered {backend} task; {hint}")
