"""Measuring tools shared by the benchmarks: device sync, GEMM meters, FLOP counts, a filled replay."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from fast_lora_td3.algos.base import OffPolicyLearner
from fast_lora_td3.replay.buffer import ReplayBuffer

__all__ = ["count_update_flops", "filled_replay", "gemm_gflops", "gemm_meter_gflops", "sync"]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings end here)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_GEMM_CACHE: dict[tuple[str, torch.dtype], float] = {}


def gemm_gflops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Measured GFLOP/s of a square matmul (n = 2048 on CPU, 8192 on CUDA; best of 5) on `device`."""
    key = (str(device), dtype)
    if key not in _GEMM_CACHE:
        n = 8192 if device.type == "cuda" else 2048
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        reps = 20 if device.type == "cuda" else 1
        torch.mm(a, b)
        best = float("inf")
        for _ in range(5):  # best of 5: the peak the device reaches, not the noise of a shared host
            sync(device)
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            sync(device)
            best = min(best, (time.perf_counter() - start) / reps)
        _GEMM_CACHE[key] = 2 * n**3 / best / 1e9
    return _GEMM_CACHE[key]


def gemm_meter_gflops(
    device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int], reps: int = 3
) -> float:
    """Mean GFLOP/s of `reps` batched GEMMs `[E, M, K] @ [E, K, N]` (the update's own shape class),
    timed like the update (a mean, not a best-of), so a fraction against it is fair on a busy host."""
    e, m, k, n = shape
    a = torch.randn(e, m, k, device=device, dtype=dtype)
    b = torch.randn(e, k, n, device=device, dtype=dtype)
    torch.bmm(a, b)
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        torch.bmm(a, b)
    sync(device)
    return 2 * e * m * k * n * reps / (time.perf_counter() - start) / 1e9


def filled_replay(
    num_envs: int,
    capacity: int,
    obs_dim: int,
    action_dim: int,
    device: torch.device,
    *,
    critic_obs_dim: int = 0,
    n_step: int = 1,
    seed: int = 0,
    **kwargs: Any,
) -> ReplayBuffer:
    """A ReplayBuffer filled to capacity with random steps (≈1 % terminations and truncations)."""
    rb = ReplayBuffer(
        num_envs,
        capacity,
        obs_dim,
        action_dim,
        critic_obs_dim=critic_obs_dim,
        device=device,
        n_step=n_step,
        **kwargs,
    )
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    for _ in range(capacity):
        ends = torch.rand(2, num_envs, generator=gen, device=device) < 0.01
        cobs = {}
        if critic_obs_dim:
            cobs = {"critic_obs": rand(num_envs, critic_obs_dim)}
            cobs["final_critic_obs"] = rand(num_envs, critic_obs_dim)
        rb.add(
            rand(num_envs, obs_dim),
            rand(num_envs, action_dim).clamp(-1, 1),
            rand(num_envs),
            ends[0],
            ends[1],
            final_obs=rand(num_envs, obs_dim),
            **cobs,
        )
    return rb


def count_update_flops(
    learner: OffPolicyLearner, batch: Any, policy_frequency: int
) -> tuple[float, float]:
    """GEMM FLOPs of one critic update and of one actor update (forward + backward), counted on
    a deep copy so that `learner` is not stepped."""
    probe = copy.deepcopy(learner)
    counts = []
    for fn in (probe.critic_update, probe.actor_step):
        with FlopCounterMode(display=False) as counter:
            fn(batch)
        counts.append(float(counter.get_total_flops()))
    return counts[0], counts[1]
