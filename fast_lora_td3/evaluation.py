"""Deterministic evaluation on separate envs (the training envs are never reset for it)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fast_lora_td3.envs.base import VecEnv


@torch.no_grad()
def evaluate(
    act: Callable[[Tensor], Tensor], env: VecEnv, max_steps: int | None = None
) -> dict[str, float]:
    """Run each env for one episode from a fresh reset with the deterministic policy `act`.

    An env that has not finished within `max_steps` (default: the task's max episode length) counts
    with its return so far. Returns `eval_return` and `eval_length` (means over envs); one host read.
    """
    obs, _ = env.reset()
    n = env.num_envs
    steps = max_steps or env.max_episode_length
    returns = torch.zeros(n, device=env.device)
    lengths = torch.zeros(n, device=env.device)
    running = torch.ones(n, dtype=torch.bool, device=env.device)
    for _ in range(steps):
        result = env.step(act(obs).clamp(-1.0, 1.0))
        returns += result.reward * running
        lengths += running.float()
        running &= ~(result.terminated | result.truncated)
        obs = result.obs
    env.episode_tracker.reset()  # eval episodes must not leak into training statistics
    mean_return, mean_length = torch.stack([returns.mean(), lengths.mean()]).tolist()
    return {"eval_return": mean_return, "eval_length": mean_length}
