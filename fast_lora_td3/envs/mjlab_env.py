"""mjlab backend: ``ManagerBasedRlEnv`` with ``auto_reset=False`` and explicit partial resets.

With ``auto_reset=False``, mjlab's ``step()`` returns the terminal observation of envs that ended
(the true final obs, so time-outs bootstrap from it) and marks them pending; we then call
``reset(env_ids=done_ids)``, which runs mjlab's own reset path (events, commands with dt=0,
observation history backfill) and recomputes observations, exactly what ``auto_reset=True`` would
have done inside ``step()``.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fast_lora_td3.envs.base import StepResult, group_tensor, select_done
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError

log = logging.getLogger(__name__)

ACTOR_GROUPS = ("actor", "policy")
"""Observation group names tried, in order, for the actor (mjlab uses `actor`)."""
CRITIC_GROUP = "critic"


def _quiet_warp() -> None:
    """Silence Warp's per-module load lines (hundreds per env build) unless asked for."""
    import os

    import warp

    warp.config.quiet = os.environ.get("FAST_LORA_TD3_WARP_VERBOSE", "0") != "1"


MJLAB_JIT_NOTICE = r"`torch\.jit\.script` is deprecated"
"""torch's notice on mjlab's `torch.jit.script`ed math helpers, shown at import on every run."""
_TABLES_PRINTED = False
"""Whether an mjlab env of this process printed its environment and manager tables already."""


@contextlib.contextmanager
def _tables_once() -> Iterator[None]:
    """mjlab prints its environment and manager tables for every env it builds; let the first env
    of the process print them (the eval env's would repeat the training env's)."""
    global _TABLES_PRINTED
    import mjlab.envs.manager_based_rl_env as rl_env

    if not _TABLES_PRINTED:
        _TABLES_PRINTED = True
        yield
        return
    shown = rl_env.print_info
    rl_env.print_info = lambda *args, **kwargs: None
    try:
        yield
    finally:
        rl_env.print_info = shown


def mjlab_task_ids() -> list[str]:
    """All task ids in mjlab's registry, including ours (importing registers them)."""
    _quiet_warp()
    with warnings.catch_warnings():  # the first import of mjlab in the process happens here
        warnings.filterwarnings("ignore", message=MJLAB_JIT_NOTICE, category=FutureWarning)
        import mjlab.tasks  # noqa: F401  (import side effect: registers the stock tasks)
        from mjlab.tasks.registry import list_tasks

        from fast_lora_td3.tasks import register_mjlab_tasks

        register_mjlab_tasks()  # FastLoRA-* ids (idempotent; also an import side effect)
    return list_tasks()


class MjlabVecEnv:
    """``VecEnv`` over an mjlab ``ManagerBasedRlEnv`` (any registered task id)."""

    task_ids = staticmethod(mjlab_task_ids)

    def __init__(self, cfg: EnvConfig) -> None:
        """Build the mjlab env for ``cfg.task`` with ``cfg.num_envs`` envs on ``cfg.device``."""
        mjlab_task_ids()  # imports mjlab quietly and populates the registry before load_env_cfg
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import load_env_cfg

        env_cfg = load_env_cfg(cfg.task)
        env_cfg.scene.num_envs = cfg.num_envs
        env_cfg.seed = cfg.seed
        env_cfg.auto_reset = False  # step() must hand back the true terminal observation
        if cfg.episode_length_s is not None:
            env_cfg.episode_length_s = float(cfg.episode_length_s)
        render_mode = "rgb_array" if cfg.video else cfg.render_mode
        self.cfg = cfg
        with _tables_once():
            self.env = ManagerBasedRlEnv(env_cfg, device=cfg.device, render_mode=render_mode)
        self.num_envs = int(self.env.num_envs)
        self.device = torch.device(self.env.device)
        self.max_episode_length = int(self.env.max_episode_length)
        self.step_dt = float(self.env.step_dt)
        self.action_dim = int(self.env.action_manager.total_action_dim)
        self.action_clip = float(cfg.action_clip)

        groups = self.env.observation_manager.active_terms
        actor = [g for g in ACTOR_GROUPS if g in groups]
        if not actor:
            raise ConfigError(
                f"env.task={cfg.task!r}: mjlab task has no actor observation group "
                f"(looked for {list(ACTOR_GROUPS)}, found {sorted(groups)})"
            )
        self.actor_group = actor[0]
        self.has_critic_obs = CRITIC_GROUP in groups
        self.critic_group = CRITIC_GROUP if self.has_critic_obs else self.actor_group
        obs, critic_obs = self.reset(seed=cfg.seed)
        self.obs_dim = int(obs.shape[-1])
        self.critic_obs_dim = int(critic_obs.shape[-1])

    def _split(self, obs_dict: dict[str, Any]) -> tuple[Tensor, Tensor]:
        obs = group_tensor(obs_dict[self.actor_group], self.num_envs)
        if not self.has_critic_obs:
            return obs, obs
        return obs, group_tensor(obs_dict[self.critic_group], self.num_envs)

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env (re-seeding mjlab's RNGs when ``seed`` is given); returns ``(obs, critic_obs)``."""
        obs_dict, _ = self.env.reset(seed=seed)
        if self.cfg.randomize_episode_start and self.max_episode_length > 1:
            # Spread the first time-outs over the whole horizon (decorrelated episodes).
            self.env.episode_length_buf = torch.randint_like(
                self.env.episode_length_buf, high=self.max_episode_length
            )
        return self._split(obs_dict)

    def step(self, actions: Tensor) -> StepResult:
        """Step, read terminal observations, then reset the envs that finished."""
        actions = actions.to(self.device, torch.float32).clamp(-self.action_clip, self.action_clip)
        obs_dict, reward, terminated, truncated, extras = self.env.step(actions)
        step_log = dict(extras.get("log", {}))
        final_obs, final_critic_obs = self._split(obs_dict)
        terminated = terminated.to(torch.bool)
        truncated = truncated.to(torch.bool)
        done = terminated | truncated
        # mjlab's step() already synchronises on its own done mask (nonzero); this one read mirrors it.
        done_ids = done.nonzero(as_tuple=False).squeeze(-1)
        obs, critic_obs = final_obs, final_critic_obs
        if done_ids.numel() > 0:
            # Clone first: reset() may reuse observation/history buffers in place.
            final_obs = final_obs.clone()
            final_critic_obs = final_critic_obs.clone() if self.has_critic_obs else final_obs
            reset_dict, reset_extras = self.env.reset(env_ids=done_ids)
            new_obs, new_critic = self._split(reset_dict)
            # Only done rows take the reset observation: the others keep the noise draw step() gave.
            obs = select_done(done, new_obs, final_obs)
            critic_obs = (
                select_done(done, new_critic, final_critic_obs) if self.has_critic_obs else obs
            )
            step_log.update(reset_extras.get("log", {}))
        return StepResult(
            obs=obs,
            critic_obs=critic_obs,
            reward=reward.to(torch.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            final_critic_obs=final_critic_obs,
            info={"log": step_log},
        )

    def render(self) -> np.ndarray | None:
        """An RGB frame when built with ``video=True`` / ``render_mode='rgb_array'``, else None."""
        return self.env.render()

    def close(self) -> None:
        """Close mjlab's renderer and recorders."""
        self.env.close()

    def deployment_info(self) -> dict[str, Any]:
        """Export facts read from the action/observation managers and the robot entity.

        Fields that cannot be read for a task are ``None`` and listed under ``"unknown"``.
        """
        return mjlab_deployment_info(self.env, self.cfg.task, self.actor_group)


def _position_gains(
    env: Any, joint_names: list[str]
) -> tuple[list[float] | None, list[float] | None]:
    """Kp/Kd per joint from the compiled MuJoCo model's position actuators (gain=kp, bias=-kp,-kd)."""
    import mujoco

    model = env.sim.mj_model
    kp: dict[str, float] = {}
    kd: dict[str, float] = {}
    for i in range(model.nu):
        # Only joint position servos (affine bias) have a Kp/Kd; motors and others are skipped.
        if (
            model.actuator_trntype[i] != mujoco.mjtTrn.mjTRN_JOINT
            or model.actuator_biastype[i] != mujoco.mjtBias.mjBIAS_AFFINE
        ):
            continue
        name = model.joint(int(model.actuator_trnid[i, 0])).name
        short = name.split("/", 1)[-1]  # entity joints are prefixed "<entity>/" in the scene
        kp[short] = float(model.actuator_gainprm[i, 0])
        kd[short] = float(-model.actuator_biasprm[i, 2])
    if not all(j in kp for j in joint_names):
        return None, None
    return [kp[j] for j in joint_names], [kd[j] for j in joint_names]


def mjlab_deployment_info(env: Any, task: str, actor_group: str) -> dict[str, Any]:
    """Best-effort deployment facts of an mjlab env (see ``MjlabVecEnv.deployment_info``)."""
    info: dict[str, Any] = {
        "task": task,
        "simulator": "mjlab",
        "control_dt": float(env.step_dt),
        "physics_dt": float(env.physics_dt),
        "joint_names": None,
        "default_joint_pos": None,
        "action_scale": None,
        "action_offset_is_default_pos": None,
        "kp": None,
        "kd": None,
    }
    om = env.observation_manager
    terms = om.active_terms[actor_group]
    dims = om.group_obs_term_dim[actor_group]
    layout = []
    for name, dim in zip(terms, dims, strict=True):
        scale = om.get_term_cfg(actor_group, name).scale
        if isinstance(scale, torch.Tensor):
            scale = scale.detach().cpu().flatten().tolist()
        layout.append({"name": name, "size": int(np.prod(dim)), "scale": scale})
    info["observation_layout"] = layout
    am = env.action_manager
    if len(am.active_terms) == 1:
        term = am.get_term(am.active_terms[0])
        names = list(getattr(term, "target_names", []) or [])
        if names:
            info["joint_names"] = names
            entity = getattr(term, "_entity", None)
            ids = getattr(term, "target_ids", None)
            if entity is not None and ids is not None:
                default = entity.data.default_joint_pos[0, ids]
                info["default_joint_pos"] = default.detach().cpu().tolist()
            info["kp"], info["kd"] = _position_gains(env, names)
        scale = getattr(term, "scale", None)
        if isinstance(scale, torch.Tensor):
            scale = scale[0].detach().cpu().tolist()
        info["action_scale"] = scale
        info["action_offset_is_default_pos"] = bool(getattr(term.cfg, "use_default_offset", False))
    info["unknown"] = [k for k, v in info.items() if v is None]
    return info
