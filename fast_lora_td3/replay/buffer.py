"""GPU-resident per-environment replay buffer with implicit next observations.

Layout: every tensor is `[num_envs, capacity_per_env, ...]`, written at one shared pointer (all envs
step together). Steps are addressed by their *absolute* index `T` (number of `add` calls before it);
`T` lives in physical column `T % capacity`. The next observation of step `T` is the observation of
step `T + 1`; only truncated steps need their true final observation, kept in a small per-env
circular side table.

Side table sizing and recycling. Truncation j of env e goes to slot `j % S` and records its owner step.
When slot reuse overwrites a still-stored truncation, that truncation's successor is lost; the buffer
then records `stale_until[e]` = that step, and sampling for env e starts after it. This is exact (no
wrong bootstrap observation is ever used): a window that starts after the newest lost truncation only
meets truncations whose final observation is still in the table, because slots are recycled oldest
first. The only cost of a too-small S is a shorter usable history for that env. Time-out truncations
of an env are at least `max_episode_length` (L) steps apart, so a C-step history holds at most
ceil(C / L) of them; the default `S = min(C, max(8, ceil(C / L) + 4))` adds slack for a randomised
first episode and a few non-time-out truncations (e.g. terrain bounds), so nothing is lost in
practice. Without L the default assumes L = 16 (no loss for any task whose time-outs are ≥ 16
steps apart; the side table then costs 1/16 of the observation storage). S = C never loses history.

Sampling windows: a start T is valid when lo[e] ≤ T ≤ hi[e], with lo = max(oldest stored, stale_until + 1)
and hi = newest, or newest − 1 when the newest step did not end an episode (its successor is not
written yet). A window stops at the first terminated or truncated step and never goes beyond hi, so
it never crosses the write pointer into the oldest data.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
from torch import Tensor

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.replay.state import load_replay_state, replay_state

__all__ = ["ReplayBuffer", "ReplaySample"]

_TERMINATED = 1
_TRUNCATED = 2


class ReplaySample(NamedTuple):
    """One n-step batch; every tensor has leading dim B, observations and actions are fp32."""

    obs: Tensor
    critic_obs: Tensor
    actions: Tensor
    rewards: Tensor
    """Σ_{i<k} γ^i r_{t+i} (fp32)."""
    next_obs: Tensor
    """Bootstrap observation: the true final obs after a truncation; a placeholder (the last step's
    own obs) after a termination, where `bootstrap` is 0."""
    next_critic_obs: Tensor
    bootstrap: Tensor
    """1 − terminated at the window's last step (fp32)."""
    discount: Tensor
    """γ^k (fp32)."""
    k: Tensor
    """Effective window length in [1, n_step] (int64)."""


def _free_device_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (CUDA: driver free + this process's cached-but-unused), or None."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


class ReplayBuffer:
    """Per-env circular n-step replay buffer; see the module docstring for the layout and rules.

    Args:
        num_envs: environments writing one row each per `add` (`env.num_envs`).
        capacity_per_env: steps stored PER ENV (`algo.buffer_size`); total = num_envs × this.
        obs_dim, action_dim, critic_obs_dim: feature sizes (critic_obs_dim = 0: no critic obs stored).
        device: storage and sampling device.
        n_step, gamma: n-step return length and discount.
        obs_dtype: storage dtype of (critic) observations (fp32, bf16 or fp16); sampled back as fp32.
        action_dtype: storage dtype of actions (default fp32; fp16 halves their bytes, lossy).
        final_obs_slots: side-table slots per env (default from `max_episode_length`, see module doc).
        max_episode_length: episode time-out in steps, used only for the default slot count.
        free_bytes: override of the free device memory used for the fit check (tests, dry runs).

    Sizes, n_step, gamma and storage dtypes come from configs that checked them (AlgoConfig,
    EnvConfig; the batch / num_envs rule is validate.check_batch_divides).
    """

    def __init__(
        self,
        num_envs: int,
        capacity_per_env: int,
        obs_dim: int,
        action_dim: int,
        *,
        critic_obs_dim: int = 0,
        device: torch.device | str = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
        final_obs_slots: int | None = None,
        max_episode_length: int | None = None,
        free_bytes: int | None = None,
    ) -> None:
        slots = self.default_final_obs_slots(capacity_per_env, max_episode_length)
        slots = slots if final_obs_slots is None else int(final_obs_slots)
        if not 1 <= slots <= capacity_per_env:
            raise ConfigError(
                f"final_obs_slots={slots} must be in [1, algo.buffer_size={capacity_per_env}]"
            )
        self.device = torch.device(device)
        self.num_envs, self.capacity = int(num_envs), int(capacity_per_env)
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.critic_obs_dim = int(critic_obs_dim)
        self.n_step, self.gamma = int(n_step), float(gamma)
        self.obs_dtype, self.action_dtype, self.final_obs_slots = obs_dtype, action_dtype, slots
        self.slot_dtype = torch.int16 if slots <= torch.iinfo(torch.int16).max else torch.int32

        needed = self.estimate_bytes(
            num_envs, capacity_per_env, obs_dim, action_dim, **self._layout()
        )
        free = _free_device_bytes(self.device) if free_bytes is None else int(free_bytes)
        if free is not None and needed > free:
            raise ConfigError(
                f"replay buffer needs {needed} bytes ({needed / 2**30:.2f} GiB) for algo.buffer_size="
                f"{capacity_per_env} steps PER ENV × env.num_envs={num_envs} "
                f"({needed / (num_envs * capacity_per_env):.0f} B/transition) but only {free} bytes "
                f"({free / 2**30:.2f} GiB) are free on {self.device}; lower algo.buffer_size or "
                "env.num_envs, or store observations in bf16"
            )

        n, c, dev = self.num_envs, self.capacity, self.device
        zeros = functools.partial(torch.zeros, device=dev)
        self.obs = zeros(n, c, obs_dim, dtype=obs_dtype)
        self.critic_obs = zeros(n, c, critic_obs_dim, dtype=obs_dtype) if critic_obs_dim else None
        self.actions = zeros(n, c, action_dim, dtype=action_dtype)
        self.rewards = zeros(n, c, dtype=torch.float32)
        self.flags = zeros(n, c, dtype=torch.uint8)
        self.slot = zeros(n, c, dtype=self.slot_dtype)
        self.final_obs = zeros(n, slots, obs_dim, dtype=obs_dtype)
        self.final_critic_obs = (
            zeros(n, slots, critic_obs_dim, dtype=obs_dtype) if critic_obs_dim else None
        )
        self.final_owner = torch.full((n, slots), -1, dtype=torch.int64, device=dev)
        self.final_count = torch.zeros(n, dtype=torch.int64, device=dev)
        self.stale_until = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.ptr = torch.zeros((), dtype=torch.int64, device=dev)
        self._num_added = 0  # host mirror of ptr for len() and checks (never read back from device)
        pows = torch.tensor([self.gamma**i for i in range(self.n_step + 1)], dtype=torch.float64)
        self._gamma_pows = pows.to(device=dev, dtype=torch.float32)
        self._offsets = torch.arange(self.n_step, device=dev)
        self._env_arange = torch.arange(n, device=dev)

    # ----------------------------------------------------------------- sizing
    @staticmethod
    def default_final_obs_slots(
        capacity_per_env: int, max_episode_length: int | None = None
    ) -> int:
        """Side-table slots per env: `min(C, max(8, ceil(C / L) + 4))`; L = 16 when unknown."""
        length = max_episode_length if max_episode_length and max_episode_length > 0 else 16
        return int(min(capacity_per_env, max(8, math.ceil(capacity_per_env / length) + 4)))

    @staticmethod
    def estimate_bytes(
        num_envs: int,
        capacity_per_env: int,
        obs_dim: int,
        action_dim: int,
        *,
        critic_obs_dim: int = 0,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
        final_obs_slots: int | None = None,
        max_episode_length: int | None = None,
    ) -> int:
        """Bytes of the buffer's state tensors (exactly what `state_dict` holds), before allocation."""
        slots = final_obs_slots or ReplayBuffer.default_final_obs_slots(
            capacity_per_env, max_episode_length
        )
        obs_b = (obs_dim + critic_obs_dim) * obs_dtype.itemsize
        slot_b = 2 if slots <= torch.iinfo(torch.int16).max else 4
        per_step = (
            obs_b + action_dim * action_dtype.itemsize + 4 + 1 + slot_b
        )  # + reward, flags, slot
        per_env = (
            capacity_per_env * per_step + slots * (obs_b + 8) + 2 * 8
        )  # side table, owners, counters
        return int(num_envs * per_env + 8)  # + the shared write pointer

    @property
    def bytes_per_transition(self) -> float:
        """Allocated bytes / (num_envs × capacity), side table included."""
        dims = (self.num_envs, self.capacity, self.obs_dim, self.action_dim)
        return self.estimate_bytes(*dims, **self._layout()) / (self.num_envs * self.capacity)

    def _layout(self) -> dict[str, object]:
        """Storage options that `estimate_bytes` needs besides the four sizes."""
        return {
            "critic_obs_dim": self.critic_obs_dim,
            "obs_dtype": self.obs_dtype,
            "action_dtype": self.action_dtype,
            "final_obs_slots": self.final_obs_slots,
        }

    @staticmethod
    def reference_transition_bytes(obs_dim: int, action_dim: int, critic_obs_dim: int = 0) -> int:
        """Bytes per transition of a FastTD3-style buffer: explicit fp32 obs and next_obs (critic too),
        fp32 actions and reward, int64 dones and truncations."""
        return 2 * (obs_dim + critic_obs_dim) * 4 + action_dim * 4 + 4 + 8 + 8

    @property
    def reference_bytes_per_transition(self) -> int:
        """`reference_transition_bytes` for this buffer's dimensions."""
        return self.reference_transition_bytes(self.obs_dim, self.action_dim, self.critic_obs_dim)

    @property
    def num_added(self) -> int:
        """Steps written per env since allocation or the loaded snapshot (host counter, no sync)."""
        return self._num_added

    # ----------------------------------------------------------------- writing
    @torch.no_grad()
    def add(
        self,
        obs: Tensor,
        actions: Tensor,
        rewards: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        final_obs: Tensor | None = None,
        critic_obs: Tensor | None = None,
        final_critic_obs: Tensor | None = None,
    ) -> None:
        """Store one step of every env: `obs` [N, obs_dim] is the observation the executed `actions`
        [N, action_dim] were taken on; `final_obs` [N, obs_dim] holds the true final observations
        (read only for truncated rows). No host synchronisation."""
        n = self.num_envs
        if obs.shape != (n, self.obs_dim) or actions.shape != (n, self.action_dim):
            raise ValueError(
                f"add: obs {tuple(obs.shape)} / actions {tuple(actions.shape)} do not match "
                f"({n}, {self.obs_dim}) / ({n}, {self.action_dim})"
            )
        if final_obs is None:
            raise ValueError(
                "add: final_obs (true final observations; non-truncated rows ignored) is required"
            )
        if self.critic_obs is not None and (critic_obs is None or final_critic_obs is None):
            raise ValueError(
                "add: critic_obs and final_critic_obs are required when critic_obs_dim > 0"
            )
        col = (self.ptr % self.capacity).reshape(1)
        term = terminated.reshape(n).bool()
        trunc = truncated.reshape(n).bool()
        self.obs.index_copy_(1, col, obs.to(self.obs_dtype).unsqueeze(1))
        self.actions.index_copy_(1, col, actions.to(self.action_dtype).unsqueeze(1))
        self.rewards.index_copy_(1, col, rewards.reshape(n, 1).float())
        flags = term.to(torch.uint8) * _TERMINATED + trunc.to(torch.uint8) * _TRUNCATED
        self.flags.index_copy_(1, col, flags.unsqueeze(1))

        # Side table: only truncations that are not also terminations bootstrap from a final obs.
        keep = trunc & ~term
        slot = self.final_count % self.final_obs_slots
        rows = self._env_arange
        self.slot.index_copy_(1, col, slot.to(self.slot_dtype).unsqueeze(1))
        old_owner = self.final_owner[rows, slot]
        self.final_obs[rows, slot] = torch.where(
            keep[:, None], final_obs.to(self.obs_dtype), self.final_obs[rows, slot]
        )
        if self.critic_obs is not None:
            new = final_critic_obs.to(self.obs_dtype)
            self.final_critic_obs[rows, slot] = torch.where(
                keep[:, None], new, self.final_critic_obs[rows, slot]
            )
        self.final_owner[rows, slot] = torch.where(keep, self.ptr, old_owner)
        # Recycling a slot loses that older truncation's final obs: sampling must start after it.
        lost = keep & (old_owner >= 0)
        self.stale_until.copy_(
            torch.where(lost, torch.maximum(self.stale_until, old_owner), self.stale_until)
        )
        self.final_count.add_(keep.to(torch.int64))
        if self.critic_obs is not None:
            self.critic_obs.index_copy_(1, col, critic_obs.to(self.obs_dtype).unsqueeze(1))
        self.ptr.add_(1)
        self._num_added += 1

    # ----------------------------------------------------------------- sampling
    def _hi(self) -> Tensor:
        """Newest valid start per env (absolute step): newest, or newest − 1 if it did not end an episode."""
        newest = self.ptr - 1
        newest_flags = self.flags.index_select(1, (newest % self.capacity).reshape(1)).squeeze(1)
        return newest - (newest_flags == 0).to(torch.int64)

    def _valid_range(self) -> tuple[Tensor, Tensor]:
        """Inclusive absolute start range (lo, hi) per env, each [num_envs] int64."""
        oldest = (self.ptr - self.capacity).clamp_min(0)
        return torch.maximum(oldest, self.stale_until + 1), self._hi()

    def _sample_starts(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Stratified uniform starts: batch_size / num_envs per env, uniform over its valid range
        (batch_size a multiple of num_envs: validate.check_batch_divides)."""
        env_idx = self._env_arange.repeat_interleave(batch_size // self.num_envs)
        lo, hi = self._valid_range()
        count = (hi - lo + 1)[env_idx]
        # 62-bit integers modulo a count ≤ capacity: the modulo bias is below 2^-40.
        draws = torch.randint(0, 2**62, (batch_size,), generator=generator, device=self.device)
        return env_idx, lo[env_idx] + draws % count

    def sample_nstep(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> ReplaySample:
        """Sample `batch_size` n-step transitions (stratified over envs); no host synchronisation."""
        if not torch.compiler.is_compiling() and self._num_added < 2:
            raise RuntimeError(
                "ReplayBuffer.sample_nstep needs at least 2 stored steps (raise learning_starts)"
            )
        env_idx, start = self._sample_starts(batch_size, generator)
        return self._gather(env_idx, start)

    def _gather(self, env_idx: Tensor, start: Tensor) -> ReplaySample:
        """n-step transition for absolute start steps `start` [B] of envs `env_idx` [B] (must be valid)."""
        c = self.capacity
        steps = start[:, None] + self._offsets  # [B, n]
        cols = steps % c
        rows = env_idx[:, None]
        in_range = steps <= self._hi()[env_idx][:, None]
        ended = ((self.flags[rows, cols] & (_TERMINATED | _TRUNCATED)) != 0) & in_range
        ended_i = ended.to(torch.int32)
        # Step i is in the window when it is written and no earlier step of the window ended an episode.
        included = in_range & ((ended_i.cumsum(1) - ended_i) == 0)
        k = included.sum(1)
        step_rewards = torch.where(included, self.rewards[rows, cols], 0.0)
        rewards = (step_rewards * self._gamma_pows[: self.n_step]).sum(1)

        last = start + k - 1
        last_col = last % c
        last_flags = self.flags[env_idx, last_col]
        term = (last_flags & _TERMINATED) != 0
        trunc = ((last_flags & _TRUNCATED) != 0) & ~term
        next_col = torch.where(term | trunc, last, last + 1) % c
        slot = self.slot[env_idx, last_col].to(torch.int64)
        start_col = start % c

        def pick(table: Tensor, finals: Tensor) -> tuple[Tensor, Tensor]:
            now = table[env_idx, start_col].float()
            nxt = torch.where(
                trunc[:, None], finals[env_idx, slot], table[env_idx, next_col]
            ).float()
            return now, nxt

        obs, next_obs = pick(self.obs, self.final_obs)
        if self.critic_obs is not None:
            critic_obs, next_critic_obs = pick(self.critic_obs, self.final_critic_obs)
        else:
            critic_obs, next_critic_obs = obs, next_obs
        return ReplaySample(
            obs=obs,
            critic_obs=critic_obs,
            actions=self.actions[env_idx, start_col].float(),
            rewards=rewards,
            next_obs=next_obs,
            next_critic_obs=next_critic_obs,
            bootstrap=(~term).float(),
            discount=self._gamma_pows[k],
            k=k,
        )

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, object]:
        """Checkpoint contents (fast_lora_td3/replay/state.py): tensors, pointers and geometry."""
        return replay_state(self)

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore a `state_dict` in place (tensor addresses are kept, so captured graphs stay valid)."""
        self._num_added = load_replay_state(self, state)
