"""Stable-Baselines3 TD3 / SAC peers for `bench learn`, writing our metrics.jsonl format.

`python -m fast_lora_td3.bench.peers sb3_td3 TASK SEED TOTAL_STEPS RUN_DIR [learning_starts=N]
[max_wall_s=S]` (max_wall_s: stop learning after S seconds, then evaluate, as our `max_wall_s`).

Hyperparameters: rl-baselines3-zoo's MuJoCo defaults (hyperparams/td3.yml and sac.yml, the
`mujoco-defaults` anchor of HalfCheetah-v4, which Hopper etc. inherit). TD3: MlpPolicy
net_arch [400, 300], learning_rate 1e-3, batch_size 256, train_freq 1, gradient_steps 1, Gaussian
action noise std 0.1, learning_starts 10000. SAC: SB3's defaults (lr 3e-4, batch 256, net
[256, 256], automatic entropy) with learning_starts 10000. Tiny smoke budgets may lower
learning_starts. One environment, as in the zoo; the rows carry `episode_return` (mean of the
training episodes that ended since the previous row), `critic_loss` (SB3's last logged value) and,
at the end, `eval_return` (10 deterministic episodes).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ZOO_MUJOCO = {
    "sb3_td3": {
        "learning_rate": 1e-3,
        "batch_size": 256,
        "train_freq": 1,
        "gradient_steps": 1,
        "learning_starts": 10_000,
        "policy_kwargs": {"net_arch": [400, 300]},
    },
    "sb3_sac": {"learning_starts": 10_000},
}
"""rl-baselines3-zoo MuJoCo settings per peer (the rest are SB3's defaults)."""
TD3_NOISE_STD = 0.1
LOG_EVERY_STEPS = 1000
LOG_EVERY_S = 10.0
EVAL_EPISODES = 10


def run_sb3_peer(
    peer: str,
    task: str,
    seed: int,
    total_steps: int,
    run_dir: Path,
    learning_starts: int | None = None,
    max_wall_s: float = 0.0,
) -> dict[str, Any]:
    """Train one SB3 peer; writes run_dir/metrics.jsonl and returns the last row."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    kwargs = dict(ZOO_MUJOCO[peer])
    if learning_starts is not None:
        kwargs["learning_starts"] = learning_starts
    env = Monitor(gym.make(task))
    if peer == "sb3_td3":
        n = env.action_space.shape[-1]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(n), TD3_NOISE_STD * np.ones(n))
    algo = TD3 if peer == "sb3_td3" else SAC
    model = algo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    metrics = (run_dir / "metrics.jsonl").open("w")
    t0 = time.perf_counter()
    state: dict[str, Any] = {"returns": [], "lengths": [], "last_step": 0, "last_t": t0}

    def write(row: dict[str, Any]) -> None:
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    def flush_row(steps: int) -> dict[str, Any]:
        row: dict[str, Any] = {"env_steps": steps, "wall_time_s": time.perf_counter() - t0}
        if state["returns"]:
            row["episode_return"] = float(np.mean(state["returns"]))
            row["episode_length"] = float(np.mean(state["lengths"]))
        loss = model.logger.name_to_value.get("train/critic_loss")
        if loss is not None:
            row["critic_loss"] = float(loss)
        state.update(returns=[], lengths=[], last_step=steps, last_t=time.perf_counter())
        write(row)
        return row

    class Rows(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    state["returns"].append(info["episode"]["r"])
                    state["lengths"].append(info["episode"]["l"])
            steps = self.num_timesteps
            if state["returns"] and (
                steps - state["last_step"] >= LOG_EVERY_STEPS
                or time.perf_counter() - state["last_t"] >= LOG_EVERY_S
            ):
                flush_row(steps)
            return not (max_wall_s > 0 and time.perf_counter() - t0 >= max_wall_s)

    try:
        model.learn(total_timesteps=total_steps, callback=Rows())
        row = flush_row(model.num_timesteps)
        eval_env = Monitor(gym.make(task))
        eval_env.reset(seed=seed)  # seeded once: the 10 episodes' start states repeat with the seed
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES)
        row = {**row, "eval_return": float(mean), "wall_time_s": time.perf_counter() - t0}
        row.pop("episode_return", None)  # already written on the previous row
        write(row)
    finally:
        metrics.close()
        env.close()
    return row


def main(argv: list[str]) -> int:
    """`bench_peers PEER TASK SEED TOTAL_STEPS RUN_DIR [learning_starts=N]`."""
    peer, task, seed, total, run_dir, *rest = argv
    opts: dict[str, str] = {}
    for word in rest:
        key, _, value = word.partition("=")
        if key not in ("learning_starts", "max_wall_s"):
            raise SystemExit(f"bench_peers: unknown option {word!r}")
        opts[key] = value
    starts = int(opts["learning_starts"]) if "learning_starts" in opts else None
    wall = float(opts.get("max_wall_s", 0.0))
    row = run_sb3_peer(peer, task, int(seed), int(total), Path(run_dir), starts, wall)
    print(f"done: {run_dir} (eval_return={row['eval_return']:.4g})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
