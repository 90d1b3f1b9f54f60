"""A stand-in for Isaac Lab's ``ManagerBasedRLEnv`` (unwrapped), shared by the Isaac Lab tests.

It follows 2.3.2's ``ManagerBasedRLEnv.step`` (checked against the wheel's source by
tests/test_isaaclab_conformance.py): actions → episode_length_buf += 1 → terminations / time-outs
→ reward (written into a reused buffer) → (≥ 3.0: ``extras["final_obs"]`` when
``cfg.compute_final_obs``) → ``_reset_idx(done ids)`` (sets ``extras["log"]``) → command update →
``observation_manager.compute(update_history=True)``; it returns
``(obs_buf, reward_buf, reset_terminated, reset_time_outs, extras)`` and ``extras`` never holds
``"time_outs"`` (only the RL-library wrappers add it).
"""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import torch

from fast_lora_td3.envs import EnvConfig
from fast_lora_td3.envs.isaaclab_env import IsaacLabVecEnv

N = 4


def plain_term(env: object) -> None:  # a plain-function observation term
    return None


class StatefulFilter:  # a class modifier (like isaaclab.utils.modifiers.DigitalFilter): keeps state
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x


class StandInObservationManager:
    def __init__(self, env: StandInEnv) -> None:
        self.env = env
        self.active_terms = {"policy": ["pos", "clock", "pos_sq"]}
        self.group_obs_term_dim = {"policy": [(1,), (1,), (1,)]}
        self._group_obs_term_cfgs = {
            "policy": [
                SimpleNamespace(func=plain_term, history_length=0, modifiers=None, noise=None)
                for _ in range(3)
            ]
        }
        self.history_updates = 0

    def compute(self, update_history: bool = False) -> dict:
        e = self.env
        self.history_updates += int(update_history)
        policy = torch.stack([e.pos, e.episode_length_buf / 100.0, e.pos**2], dim=-1)
        groups = {"policy": policy}
        if e.with_critic:  # a non-concatenated group: a dict of term tensors
            groups["critic"] = {
                "pos": e.pos[:, None].clone(),
                "clock": e.episode_length_buf[:, None].float(),
            }
        return groups


class StandInEnv:
    """Mimics isaaclab.envs.ManagerBasedRLEnv (unwrapped)."""

    def __init__(
        self,
        native_final: bool | None,
        finite: bool = False,
        critic: bool = True,
        managers: bool = True,
    ) -> None:
        cfg = SimpleNamespace(is_finite_horizon=finite, seed=None)
        if native_final is not None:  # Isaac Lab ≥ 3.0 has the field; 2.x does not
            cfg.compute_final_obs = native_final
        self.cfg, self.with_critic, self.managers = cfg, critic, managers
        self.num_envs, self.device, self.step_dt = N, "cpu", 0.02
        self.max_episode_length = 5
        self.single_action_space = gym.spaces.Box(-float("inf"), float("inf"), shape=(2,))
        self.episode_length_buf = torch.zeros(N, dtype=torch.long)
        self.pos = torch.zeros(N)
        self.reward_buf = torch.zeros(N)
        self.reset_terminated = torch.zeros(N, dtype=torch.bool)
        self.reset_time_outs = torch.zeros(N, dtype=torch.bool)
        self.extras: dict = {}
        self._om = StandInObservationManager(self)
        self.last_actions: torch.Tensor | None = None
        self.reset_calls: list[list[int]] = []
        self.closed = False

    @property
    def observation_manager(self) -> StandInObservationManager:
        if not self.managers:  # a direct-workflow env has no observation manager
            raise AttributeError("observation_manager")
        return self._om

    @property
    def unwrapped(self) -> StandInEnv:
        return self

    def seed(self, seed: int = -1) -> int:
        self.cfg.seed = seed
        return seed

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        self.reset_calls.append(env_ids.tolist())
        self.pos[env_ids] = -0.25 * (env_ids.float() + 1)  # distinct from any terminal state
        self.episode_length_buf[env_ids] = 0
        self.extras["log"] = {"Episode_Termination/time_out": torch.tensor(1.0)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._reset_idx(torch.arange(N))
        return self._om.compute(update_history=True), self.extras

    def step(self, action: torch.Tensor) -> tuple:
        self.last_actions = action.clone()  # extras["log"] lingers until the next reset (as 2.3)
        self.pos += action.mean(-1)
        self.episode_length_buf += 1
        self.reset_terminated[:] = self.pos.abs() > 2.0
        self.reset_time_outs[:] = self.episode_length_buf >= self.max_episode_length
        self.reward_buf[:] = self.pos  # the same buffer, rewritten every step
        done_ids = (self.reset_terminated | self.reset_time_outs).nonzero().squeeze(-1)
        if len(done_ids) > 0:
            if getattr(self.cfg, "compute_final_obs", False):
                self.extras["final_obs"] = self._om.compute()
            self._reset_idx(done_ids)
        self.obs_buf = self._om.compute(update_history=True)
        return (
            self.obs_buf,
            self.reward_buf,
            self.reset_terminated,
            self.reset_time_outs,
            self.extras,
        )

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class StandInApp:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def make_isaaclab_env(
    native_final: bool | None, **cfg_kw: object
) -> tuple[IsaacLabVecEnv, StandInEnv, StandInApp]:
    """The adapter over a fresh stand-in: ``(env, stand_in, app)``; ``finite``, ``critic`` and
    ``managers`` go to the stand-in, the other keywords to the ``EnvConfig``."""
    flags = {k: cfg_kw.pop(k) for k in ("finite", "critic", "managers") if k in cfg_kw}
    stand_in, app = StandInEnv(native_final, **flags), StandInApp()
    cfg = EnvConfig(
        backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N, seed=9, **cfg_kw
    )
    return IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app)), stand_in, app
