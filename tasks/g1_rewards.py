"""Reward and observation terms of the off-policy G1 locomotion task (FastSAC's recipe).

Each term is a pure tensor function (``*_from``), unit-tested on hand-made states, plus a thin
mjlab wrapper with the ``(env, **params)`` signature that mjlab's managers call. Signs: the
"reward" terms are ≥ 0 and used with positive weights; the "penalty" terms are ≥ 0 and used with
negative weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.managers.scene_entity_config import SceneEntityCfg

REWARD_WEIGHTS = {
    "track_linear_velocity": 2.0,
    "track_angular_velocity": 1.5,
    "feet_phase": 5.0,
    "alive": 10.0,
    "ang_vel_xy": -1.0,
    "orientation": -10.0,
    "action_rate": -2.0,
    "pose": -0.5,
    "feet_too_close": -10.0,
    "foot_orientation": -5.0,
}
"""FastSAC humanoid recipe weights; every term is ≥ 0, so the weight's sign is the reward's sign."""

GAIT_PERIOD_S = 0.8
"""Gait cycle length; the left foot swings in the first half, the right foot in the second."""


# Pure tensor functions.


def gait_phase_from(time_s: Tensor, period_s: float = GAIT_PERIOD_S) -> Tensor:
    """Gait phase in [0, 1) of each env from its time in the episode [N]."""
    return torch.remainder(time_s / period_s, 1.0)


def gait_phase_obs_from(phase: Tensor) -> Tensor:
    """[N, 2] observation (sin 2πφ, cos 2πφ): continuous across the wrap from 1 to 0."""
    angle = 2.0 * math.pi * phase
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1)


def desired_feet_height_from(
    phase: Tensor, command: Tensor, swing_height: float, command_threshold: float
) -> Tensor:
    """[N, 2] target (left, right) foot heights: a sine arc in each foot's swing half-cycle.

    Under a command below ``command_threshold`` both targets are 0 (stand with both feet down).
    """
    leg_phase = torch.stack([phase, torch.remainder(phase + 0.5, 1.0)], dim=-1)
    arc = swing_height * torch.sin(2.0 * math.pi * leg_phase).clamp(min=0.0)
    moving = torch.linalg.vector_norm(command[:, :3], dim=-1, keepdim=True) > command_threshold
    return torch.where(moving, arc, torch.zeros_like(arc))


def feet_phase_reward_from(
    feet_height: Tensor,
    phase: Tensor,
    command: Tensor,
    swing_height: float = 0.08,
    std: float = 0.05,
    command_threshold: float = 0.1,
) -> Tensor:
    """[N] in (0, 1]: exp(-Σ_feet (h - h_target)² / std²), 1 when the feet follow the gait phase."""
    target = desired_feet_height_from(phase, command, swing_height, command_threshold)
    err = torch.sum(torch.square(feet_height - target), dim=-1)
    return torch.exp(-err / std**2)


def lateral_feet_separation_from(left_xy: Tensor, right_xy: Tensor, heading: Tensor) -> Tensor:
    """[N] signed distance of the left foot to the left of the right foot, in the heading frame."""
    left_axis = torch.stack([-torch.sin(heading), torch.cos(heading)], dim=-1)
    return torch.sum((left_xy - right_xy) * left_axis, dim=-1)


def feet_too_close_penalty_from(
    left_xy: Tensor, right_xy: Tensor, heading: Tensor, min_separation: float = 0.15
) -> Tensor:
    """[N] ≥ 0: how far the lateral separation is below ``min_separation`` (crossed feet: larger)."""
    sep = lateral_feet_separation_from(left_xy, right_xy, heading)
    return torch.relu(min_separation - sep)


def foot_tilt_penalty_from(feet_gravity_f: Tensor) -> Tensor:
    """[N] ≥ 0: Σ_feet of the squared xy gravity components in each foot frame (0 = flat feet)."""
    return torch.sum(torch.square(feet_gravity_f[..., :2]), dim=(-1, -2))


def squared_norm_from(x: Tensor) -> Tensor:
    """[N] ≥ 0: Σ x² over the last axis (pose deviation, xy angular velocity, ...)."""
    return torch.sum(torch.square(x), dim=-1)


# mjlab wrappers (called by mjlab's observation/reward managers).


def _env_time_s(env: ManagerBasedRlEnv) -> Tensor:
    return env.episode_length_buf.to(torch.float32) * env.step_dt


def gait_phase(env: ManagerBasedRlEnv, period_s: float = GAIT_PERIOD_S) -> Tensor:
    """Observation term: [N, 2] sin/cos of the gait phase (clock = the episode step counter)."""
    return gait_phase_obs_from(gait_phase_from(_env_time_s(env), period_s))


def feet_phase(
    env: ManagerBasedRlEnv,
    command_name: str,
    sensor_name: str,
    period_s: float = GAIT_PERIOD_S,
    swing_height: float = 0.08,
    std: float = 0.05,
    command_threshold: float = 0.1,
) -> Tensor:
    """Reward term: feet heights (terrain height sensor, left then right) follow the gait phase."""
    heights = env.scene[sensor_name].data.heights
    command = env.command_manager.get_command(command_name)
    phase = gait_phase_from(_env_time_s(env), period_s)
    return feet_phase_reward_from(heights, phase, command, swing_height, std, command_threshold)


def feet_too_close(
    env: ManagerBasedRlEnv, asset_cfg: SceneEntityCfg, min_separation: float = 0.15
) -> Tensor:
    """Penalty term: lateral feet separation below ``min_separation`` (sites: left, right)."""
    asset = env.scene[asset_cfg.name]
    pos = asset.data.site_pos_w[:, asset_cfg.site_ids, :2]
    return feet_too_close_penalty_from(pos[:, 0], pos[:, 1], asset.data.heading_w, min_separation)


def foot_orientation(env: ManagerBasedRlEnv, asset_cfg: SceneEntityCfg) -> Tensor:
    """Penalty term: tilt of the foot sites (gravity direction expressed in each foot frame)."""
    from mjlab.utils.lab_api.math import quat_apply_inverse

    asset = env.scene[asset_cfg.name]
    quat = asset.data.site_quat_w[:, asset_cfg.site_ids]  # [N, F, 4] (w, x, y, z)
    gravity = torch.tensor([0.0, 0.0, -1.0], device=quat.device).expand(*quat.shape[:-1], 3)
    return foot_tilt_penalty_from(quat_apply_inverse(quat, gravity))


def pose_l2(env: ManagerBasedRlEnv, asset_cfg: SceneEntityCfg) -> Tensor:
    """Penalty term: Σ (q - q_default)² over the selected joints."""
    asset = env.scene[asset_cfg.name]
    ids = asset_cfg.joint_ids
    return squared_norm_from(asset.data.joint_pos[:, ids] - asset.data.default_joint_pos[:, ids])


def ang_vel_xy_l2(env: ManagerBasedRlEnv, asset_cfg: SceneEntityCfg) -> Tensor:
    """Penalty term: squared roll/pitch rate of the base (body frame)."""
    return squared_norm_from(env.scene[asset_cfg.name].data.root_link_ang_vel_b[:, :2])
