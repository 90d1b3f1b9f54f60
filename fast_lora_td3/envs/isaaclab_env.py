"""Isaac Lab backend (SPEC §4.2). Nothing here imports ``isaaclab`` at module import time.

Start-up order matters: ``isaaclab.app.AppLauncher`` must run before any ``isaaclab.*`` /
``isaaclab_tasks`` import, so every such import lives inside ``_launch_and_make``.

True final observations (SPEC §4.3), in order of preference:

1. Isaac Lab ≥ 3.0: ``env_cfg.compute_final_obs = True`` makes ``step()`` put the pre-reset
   observations of all envs in ``extras["final_obs"]`` (a group dict). The key lingers across steps,
   so rows are taken only where this step's done mask is set.
2. Isaac Lab 2.x (no such field): ``ManagerBasedRLEnv.step`` resets done envs through
   ``_reset_idx(env_ids)`` after rewards/terminations and before computing observations. We wrap
   that method on the instance to compute ``observation_manager.compute()`` first, i.e. the
   observation of the terminal state (commands are the ones before this step's command update).
   ``_reset_idx`` is not public API, but it has been stable since Orbit.
3. Neither available (e.g. a direct-workflow env): ``final_obs`` falls back to the post-reset
   observation, ``info["final_obs_exact"]`` is False, and a warning is logged once.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.envs.base import EpisodeTracker, StepResult, as_float_obs, select_done
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError

log = logging.getLogger(__name__)

POLICY_GROUP = "policy"
CRITIC_GROUP = "critic"


def _group_tensor(group: Any, num_envs: int) -> Tensor:
    """A group tensor as ``[N, -1]`` float32; a dict group (non-concatenated terms) flattened in order."""
    if isinstance(group, dict):
        return torch.cat([as_float_obs(v, num_envs) for v in group.values()], dim=-1)
    return as_float_obs(group, num_envs)


def _launch_and_make(cfg: EnvConfig) -> tuple[Any, Any]:
    """Start Isaac Sim headless, then import Isaac Lab and ``gym.make`` the task; returns (env, app)."""
    from isaaclab.app import AppLauncher  # the only isaaclab import allowed before the app runs

    launcher = AppLauncher(headless=True, device=cfg.device, enable_cameras=bool(cfg.video))
    app = launcher.app
    try:
        import gymnasium as gym
        import isaaclab_tasks  # noqa: F401  (registers the stock Isaac-* tasks)
        from isaaclab_tasks.utils import parse_env_cfg

        from fast_lora_td3.tasks.isaaclab_g1 import register_isaaclab_tasks

        register_isaaclab_tasks()
        if cfg.task not in gym.registry:
            from fast_lora_td3.envs.factory import unknown_task_error

            ids = [k for k in gym.registry if k.startswith(("Isaac-", "FastLoRA-"))]
            raise unknown_task_error("isaaclab", cfg.task, ids)
        env_cfg = parse_env_cfg(cfg.task, device=cfg.device, num_envs=cfg.num_envs)
        env_cfg.seed = cfg.seed
        if cfg.episode_length_s is not None:
            env_cfg.episode_length_s = float(cfg.episode_length_s)
        if hasattr(env_cfg, "compute_final_obs"):
            env_cfg.compute_final_obs = True  # Isaac Lab ≥ 3.0: extras["final_obs"]
        render_mode = "rgb_array" if cfg.video else cfg.render_mode
        env = gym.make(cfg.task, cfg=env_cfg, render_mode=render_mode)
    except BaseException:
        app.close()  # never leave a Kit process behind on a failed start
        raise
    return env, app


class IsaacLabVecEnv:
    """``VecEnv`` over an Isaac Lab manager-based RL env (``policy`` / ``critic`` groups).

    ``make_gym_env`` is a seam for tests: given the config it returns ``(gym_env, app_or_None)``
    without starting Isaac Sim.
    """

    def __init__(
        self,
        cfg: EnvConfig,
        make_gym_env: Callable[[EnvConfig], tuple[Any, Any]] | None = None,
    ) -> None:
        """Launch (or receive) the env, install the final-observation path, and reset once."""
        self.cfg = cfg
        self.env, self._app = (make_gym_env or _launch_and_make)(cfg)
        self._closed = False
        atexit.register(self.close)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        u = self.env.unwrapped
        self.unwrapped = u
        self.num_envs = int(u.num_envs)
        self.device = torch.device(u.device)
        self.max_episode_length = int(u.max_episode_length)
        self.action_clip = float(self.cfg.action_clip)
        self.action_dim = int(u.single_action_space.shape[-1])
        self._finite_horizon = bool(getattr(u.cfg, "is_finite_horizon", False))
        self._native_final = bool(getattr(u.cfg, "compute_final_obs", False))
        self._hooked = False
        self._in_step = False
        self._captured: dict[str, Any] | None = None
        if (
            not self._native_final
            and hasattr(u, "_reset_idx")
            and hasattr(u, "observation_manager")
        ):
            original = u._reset_idx

            def reset_idx_with_final_obs(env_ids: Any, *args: Any, **kwargs: Any) -> Any:
                if self._in_step:  # only resets triggered inside step() end an episode
                    self._captured = u.observation_manager.compute()
                return original(env_ids, *args, **kwargs)

            u._reset_idx = reset_idx_with_final_obs
            self._hooked = True
        self._warned = False
        self.episode_tracker = EpisodeTracker(self.num_envs, self.device)
        obs, critic_obs = self.reset(seed=self.cfg.seed)
        self.obs_dim = int(obs.shape[-1])
        self.critic_obs_dim = int(critic_obs.shape[-1])

    def _split(self, obs_dict: dict[str, Any]) -> tuple[Tensor, Tensor]:
        if POLICY_GROUP not in obs_dict:
            raise ConfigError(
                f"env.task={self.cfg.task!r}: Isaac Lab task has no '{POLICY_GROUP}' observation "
                f"group (found {sorted(obs_dict)})"
            )
        obs = _group_tensor(obs_dict[POLICY_GROUP], self.num_envs)
        self.has_critic_obs = CRITIC_GROUP in obs_dict
        if not self.has_critic_obs:
            return obs, obs
        return obs, _group_tensor(obs_dict[CRITIC_GROUP], self.num_envs)

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env (seeding Isaac Lab's RNGs when given); returns ``(obs, critic_obs)``."""
        if seed is not None and hasattr(self.unwrapped, "seed"):
            self.unwrapped.seed(seed)
        obs_dict, _ = self.env.reset()
        if self.cfg.randomize_episode_start and self.max_episode_length > 1:
            # Decorrelated horizons: envs start part-way into their first episode.
            buf = self.unwrapped.episode_length_buf
            self.unwrapped.episode_length_buf = torch.randint_like(
                buf, high=self.max_episode_length
            )
        self.episode_tracker.reset()
        return self._split(obs_dict)

    def step(self, actions: Tensor) -> StepResult:
        """Step (Isaac Lab resets done envs inside), and recover their true final observations."""
        actions = actions.to(self.device, torch.float32).clamp(-self.action_clip, self.action_clip)
        self._captured = None
        self._in_step = True
        try:
            obs_dict, reward, terminated, truncated, extras = self.env.step(actions)
        finally:
            self._in_step = False
        obs, critic_obs = self._split(obs_dict)
        # Isaac Lab reuses its reward/termination buffers in place: copy before handing them out.
        reward = reward.to(torch.float32).clone()
        terminated = terminated.to(torch.bool).clone()
        truncated = truncated.to(torch.bool).clone()
        if self._finite_horizon:  # a time limit that defines the task is a true terminal
            terminated, truncated = terminated | truncated, torch.zeros_like(truncated)
        done = terminated | truncated
        source = extras.get("final_obs") if self._native_final else self._captured
        # Exact whenever a final-obs path exists: it yields a source on every step with a done env.
        exact = self._native_final or self._hooked
        if source is not None:
            f_obs, f_critic = self._split(source)
            final_obs = select_done(done, f_obs, obs)
            final_critic_obs = (
                select_done(done, f_critic, critic_obs) if self.has_critic_obs else final_obs
            )
        else:
            final_obs, final_critic_obs = obs, critic_obs
            if not exact and not self._warned:
                log.warning(
                    "Isaac Lab env gives no final observation (no compute_final_obs, no _reset_idx "
                    "hook): time-outs bootstrap from the next episode's first observation"
                )
                self._warned = True
        episode = self.episode_tracker.update(reward, done)
        return StepResult(
            obs=obs,
            critic_obs=critic_obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            final_critic_obs=final_critic_obs,
            info={"log": dict(extras.get("log", {})), "episode": episode, "final_obs_exact": exact},
        )

    def render(self) -> Any:
        """An RGB frame when built with ``video=True`` (cameras enabled), else None."""
        return self.env.render()

    def close(self) -> None:
        """Close the env, then the simulation app (also runs at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.env.close()
        finally:
            if self._app is not None:
                self._app.close()
        atexit.unregister(self.close)

    def deployment_info(self) -> dict[str, Any]:
        """Best-effort export facts from the action/observation managers and the robot."""
        u = self.unwrapped
        info: dict[str, Any] = {"task": self.cfg.task, "simulator": "isaaclab"}
        info["control_dt"] = float(getattr(u, "step_dt", 0.0)) or None
        info["observation_layout"] = None
        info["joint_names"] = info["default_joint_pos"] = info["action_scale"] = None
        info["kp"] = info["kd"] = None
        om = getattr(u, "observation_manager", None)
        if om is not None:
            names = om.active_terms[POLICY_GROUP]
            dims = om.group_obs_term_dim[POLICY_GROUP]
            info["observation_layout"] = [
                {"name": n, "size": int(torch.tensor(d).prod()), "scale": None}
                for n, d in zip(names, dims, strict=True)
            ]
        am = getattr(u, "action_manager", None)
        if am is not None and len(am.active_terms) == 1:
            term = am.get_term(am.active_terms[0])
            info["joint_names"] = list(getattr(term, "_joint_names", []) or []) or None
            scale = getattr(term, "_scale", None)
            info["action_scale"] = scale.tolist() if isinstance(scale, Tensor) else scale
            asset = getattr(term, "_asset", None)
            ids = getattr(term, "_joint_ids", None)
            if asset is not None and ids is not None:
                data = asset.data
                info["default_joint_pos"] = data.default_joint_pos[0, ids].tolist()
                info["kp"] = data.joint_stiffness[0, ids].tolist()
                info["kd"] = data.joint_damping[0, ids].tolist()
        info["unknown"] = [k for k, v in info.items() if v is None]
        return info
