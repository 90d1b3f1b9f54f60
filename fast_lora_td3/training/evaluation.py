"""Deterministic evaluation: on separate envs (the training envs are never reset for it), or on a
slice of the training envs where the simulator allows one env per process (Isaac Lab)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fast_lora_td3.envs.base import EpisodeTracker, VecEnv
from fast_lora_td3.errors import ConfigError


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
    mean_return, mean_length = torch.stack([returns.mean(), lengths.mean()]).tolist()
    return {"eval_return": mean_return, "eval_length": mean_length}


class SliceEvaluation:
    """Evaluation on a slice of the training envs, for simulators that allow one env per process
    (Isaac Lab: a second ``ManagerBasedRLEnv`` in the same process raises).

    The first ``num_eval`` envs act deterministically all the time; their episodes are counted here
    and kept out of the training statistics (the collector's tracker covers the other envs). Their
    transitions still go to replay (off-policy data). ``pop`` reports the episodes that finished
    since the last evaluation; each was played by the policy as it was being trained.
    """

    def __init__(self, env: VecEnv, num_eval: int) -> None:
        """Reserve the first ``num_eval`` rows of ``env`` (must be < ``env.num_envs``)."""
        if not 0 < num_eval < env.num_envs:
            raise ConfigError(
                f"eval.num_envs={num_eval} must be in [1, env.num_envs={env.num_envs}) here: "
                "this simulator evaluates on a slice of the training envs"
            )
        self.rows = num_eval
        self.tracker = EpisodeTracker(num_eval, env.device)

    def actions(self, act: Callable[[Tensor], Tensor], obs: Tensor, explore: Tensor) -> Tensor:
        """``explore`` with the eval rows replaced by the deterministic policy's actions."""
        return torch.cat([act(obs[: self.rows]).clamp(-1.0, 1.0), explore[self.rows :]])

    def record(self, reward: Tensor, done: Tensor) -> None:
        """Count one step of the eval rows (no host read)."""
        self.tracker.update(reward[: self.rows], done[: self.rows])

    def pop(self) -> dict[str, float]:
        """`eval_return` / `eval_length` of the eval episodes finished since the last call."""
        stats = self.tracker.pop()
        if stats is None:
            return {}
        mean_return, mean_length = torch.stack(
            [stats["mean_return"], stats["mean_length"]]
        ).tolist()
        return {"eval_return": mean_return, "eval_length": mean_length}
