"""Five-minute smoke test of the Isaac Lab adapter (needs Isaac Lab 2.3 + Isaac Sim and a GPU).

    export OMNI_KIT_ACCEPT_EULA=YES
    python scripts/isaaclab_smoke.py                                  # our FastLoRA G1 task
    python scripts/isaaclab_smoke.py --task Isaac-Velocity-Flat-G1-v0 # the stock task

64 envs, 100 steps, 1 s episodes (50 policy steps, so every env times out within the run), random
actions. Asserts: the adapter has an exact final-observation path; observations and rewards are
finite; time-outs are truncations (not terminations); for every done env the final observation is
the pre-reset one and the returned observation is the reset one, checked on the episode clock
(FastLoRA tasks: the gait-phase columns, sin/cos of the time in the episode: exactly the phase at
the time limit vs. phase 0); for running envs final_obs == obs. Exits 0 on success, 1 on any
failure (the Kit app is closed last, see ``finish_simulation_app``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass

import torch
from torch import Tensor

TASK = "FastLoRA-Isaac-Velocity-Flat-G1-v0"
GAIT_POLICY = slice(-2, None)
"""Gait-phase (sin, cos) columns of the FastLoRA policy group (its last term)."""
GAIT_CRITIC = slice(-5, -3)
"""Gait-phase columns of the FastLoRA critic group (followed by base_lin_vel, 3 columns)."""


@dataclass
class ClockCheck:
    """Where an episode clock sits in the observations and what it reads at the two ends."""

    policy: slice
    critic: slice | None
    at_time_limit: Tensor
    """Expected clock columns in the final observation of a time-out."""
    at_reset: Tensor
    """Expected clock columns in the first observation of an episode."""


def fastlora_clock(max_episode_length: int, step_dt: float) -> ClockCheck:
    """The gait-phase clock of our G1 tasks (``tasks/g1_rewards.py``)."""
    from fast_lora_td3.tasks import g1_rewards as r

    def phase(t: float) -> Tensor:
        return r.gait_phase_obs_from(r.gait_phase_from(torch.tensor([t])))[0]

    return ClockCheck(GAIT_POLICY, GAIT_CRITIC, phase(max_episode_length * step_dt), phase(0.0))


def check_run(env: object, steps: int, clock: ClockCheck | None, seed: int = 0) -> dict[str, int]:
    """Step ``env`` (a fast_lora_td3 VecEnv) with random actions and assert final-obs correctness."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    counts = {"steps": 0, "truncated": 0, "terminated": 0}
    for _ in range(steps):
        actions = torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1
        r = env.step(actions.to(env.device))
        assert r.info["final_obs_exact"], (
            "no exact final-observation path: time-outs not bootstrapped"
        )
        for name in ("obs", "critic_obs", "reward", "final_obs", "final_critic_obs"):
            assert torch.isfinite(getattr(r, name)).all(), f"non-finite {name}"
        done = r.terminated | r.truncated
        running = ~done
        assert torch.equal(r.final_obs[running], r.obs[running]), (
            "final_obs != obs for running envs"
        )
        if clock is not None:
            _check_clock(r.final_obs, r.obs, r.truncated, done, clock.policy, clock)
            if clock.critic is not None and env.has_critic_obs:
                _check_clock(
                    r.final_critic_obs, r.critic_obs, r.truncated, done, clock.critic, clock
                )
        counts["steps"] += 1
        counts["truncated"] += int(r.truncated.sum())
        counts["terminated"] += int(r.terminated.sum())
    assert counts["truncated"] > 0, "no time-out in the run: cannot check the final observations"
    return counts


def _check_clock(
    final: Tensor, obs: Tensor, truncated: Tensor, done: Tensor, cols: slice, clock: ClockCheck
) -> None:
    at_limit = clock.at_time_limit.to(final.device)
    at_reset = clock.at_reset.to(final.device)
    if truncated.any():
        got = final[truncated][:, cols]
        assert torch.allclose(got, at_limit.expand_as(got), atol=1e-4), (
            f"final obs of time-outs is not the pre-reset one: clock {got[0].tolist()} "
            f"!= {at_limit.tolist()}"
        )
    if done.any():
        got = obs[done][:, cols]
        assert torch.allclose(got, at_reset.expand_as(got), atol=1e-4), (
            f"obs of reset envs is not the new episode's first: clock {got[0].tolist()}"
        )


def main(argv: list[str] | None = None) -> int:
    """Build the env through the adapter, run the checks, close Kit last; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--num_envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--episode_length_s", type=float, default=1.0)
    ns = parser.parse_args(argv)

    from fast_lora_td3.envs import EnvConfig, make_env
    from fast_lora_td3.envs.isaaclab_env import finish_simulation_app

    code = 1
    try:
        cfg = EnvConfig(
            backend="isaaclab",
            task=ns.task,
            num_envs=ns.num_envs,
            device=ns.device,
            seed=0,
            episode_length_s=ns.episode_length_s,
        )
        env = make_env(cfg)
        clock = None
        if ns.task.startswith("FastLoRA-"):
            clock = fastlora_clock(env.max_episode_length, float(env.unwrapped.step_dt))
            assert env.has_critic_obs, "FastLoRA task without a critic group"
        counts = check_run(env, ns.steps, clock)
        print(
            f"isaaclab smoke: ok ({ns.task}, {env.num_envs} envs, obs {env.obs_dim}, critic "
            f"{env.critic_obs_dim}, actions {env.action_dim}, {counts})",
            flush=True,
        )
        env.close()
        code = 0
    except BaseException:  # every failure is printed before Kit closes; exit status 1
        traceback.print_exc()
        print("isaaclab smoke: FAILED", file=sys.stderr, flush=True)
    return finish_simulation_app(code)


if __name__ == "__main__":
    sys.exit(main())
