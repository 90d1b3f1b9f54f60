"""`bench replay`: bytes per transition against a buffer that stores next_obs explicitly, and the
samples/s of `sample_nstep`; one JSON line."""

from __future__ import annotations

import time
from typing import Any

import torch

from fast_lora_td3.bench.config import ReplayBenchConfig
from fast_lora_td3.bench.meters import filled_replay, sync
from fast_lora_td3.config.validate import check_batch_divides, resolve_device

__all__ = ["bench_replay"]


def bench_replay(cfg: ReplayBenchConfig) -> dict[str, Any]:
    """Bytes per transition (vs a buffer with explicit next_obs) and sample_nstep throughput."""
    device = torch.device(resolve_device(cfg.device))
    algo = cfg.algo
    num_envs, batch = cfg.num_envs, algo.batch_size
    check_batch_divides(batch, num_envs)
    rb = filled_replay(
        num_envs,
        algo.buffer_size,
        cfg.obs_dim,
        cfg.action_dim,
        device,
        critic_obs_dim=cfg.critic_obs_dim,
        n_step=algo.n_step,
        gamma=algo.gamma,
        max_episode_length=cfg.max_episode_length,
        obs_dtype=getattr(torch, algo.replay_obs_dtype),
        action_dtype=getattr(torch, algo.replay_action_dtype),
    )
    for _ in range(cfg.warmup):
        rb.sample_nstep(batch)
    iters = cfg.iters
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        rb.sample_nstep(batch)
    sync(device)
    sec = (time.perf_counter() - start) / iters
    bpt, ref = rb.bytes_per_transition, rb.reference_bytes_per_transition
    return {
        "name": "replay",
        "device": str(device),
        "obs_dim": rb.obs_dim,
        "critic_obs_dim": rb.critic_obs_dim,
        "action_dim": rb.action_dim,
        "obs_dtype": algo.replay_obs_dtype,
        "num_envs": num_envs,
        "buffer_size": rb.capacity,
        "n_step": rb.n_step,
        "bytes_per_transition": bpt,
        "reference_bytes_per_transition": ref,
        "ratio_to_reference": bpt / ref,
        "batch_size": batch,
        "samples_per_s": batch / sec,
        "ms_per_sample": 1e3 * sec,
    }
