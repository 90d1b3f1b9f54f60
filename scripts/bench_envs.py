"""Env-steps/s of a backend/task with random actions; prints one JSON line per result.

Example: python scripts/bench_envs.py --task Mjlab-Cartpole-Swingup --num-envs 1024 --steps 300
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fast_lora_td3.envs import EnvConfig, make_env


def bench(backend: str, task: str, num_envs: int, steps: int, warmup: int, device: str) -> dict:
    """Time ``steps`` env steps (after ``warmup``) and return the result record."""
    env = make_env(EnvConfig(backend=backend, task=task, num_envs=num_envs, device=device))
    gen = torch.Generator(device=env.device).manual_seed(0)
    try:
        for _ in range(warmup):
            env.step(torch.rand(num_envs, env.action_dim, generator=gen, device=env.device) * 2 - 1)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        start = time.perf_counter()
        for _ in range(steps):
            env.step(torch.rand(num_envs, env.action_dim, generator=gen, device=env.device) * 2 - 1)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        elapsed = time.perf_counter() - start
    finally:
        env.close()
    return {
        "name": "env_steps",
        "backend": backend,
        "task": task,
        "device": str(env.device),
        "num_envs": num_envs,
        "steps": steps,
        "seconds": round(elapsed, 3),
        "env_steps_per_s": round(num_envs * steps / elapsed, 1),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    """Parse arguments and print one JSON line per (task, num_envs) pair."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="mjlab")
    p.add_argument("--task", action="append", help="repeatable; default: mjlab cartpole swing-up")
    p.add_argument("--num-envs", type=int, action="append", help="repeatable, paired with --task")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    tasks = a.task or ["Mjlab-Cartpole-Swingup"]
    nums = a.num_envs or [1024] * len(tasks)
    if len(nums) == 1:
        nums = nums * len(tasks)
    for task, n in zip(tasks, nums, strict=True):
        print(json.dumps(bench(a.backend, task, n, a.steps, a.warmup, a.device)), flush=True)


if __name__ == "__main__":
    main()
