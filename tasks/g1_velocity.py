"""Off-policy G1 velocity task for mjlab, built from mjlab's stock G1 velocity config.

Changes from ``Mjlab-Velocity-{Flat,Rough}-Unitree-G1`` (PPO-tuned):
* observations: actor = base ang vel, projected gravity, command, joint pos − default, joint vel,
  last action, gait phase sin/cos; critic = the same without noise + base linear velocity;
* rewards: the FastSAC humanoid recipe (weights and signs in ``REWARD_WEIGHTS``);
* PD position control with action scale 0.25; 50 Hz policy / 200 Hz physics; 20 s episodes;
* pushes every 5–10 s (±1 m/s in x, y), Kp/Kd × U(0.9, 1.1) per episode, base mass ×U(0.9, 1.1)
  (mass-consistent pseudo-inertia scaling), foot friction U(0.3, 1.2), 0–1 policy-step actuator
  command delay (0–4 physics steps);
* the PPO command-velocity curriculum is dropped (its stage boundaries are PPO iteration counts).
"""

from __future__ import annotations

import dataclasses
import math

from mjlab.envs import ManagerBasedRlEnvCfg
from mjlab.envs import mdp as envs_mdp
from mjlab.envs.mdp import dr
from mjlab.envs.mdp.actions import JointPositionActionCfg
from mjlab.managers.event_manager import EventTermCfg
from mjlab.managers.observation_manager import ObservationGroupCfg, ObservationTermCfg
from mjlab.managers.reward_manager import RewardTermCfg
from mjlab.managers.scene_entity_config import SceneEntityCfg
from mjlab.tasks.velocity import mdp
from mjlab.tasks.velocity.config.g1.env_cfgs import (
    unitree_g1_flat_env_cfg,
    unitree_g1_rough_env_cfg,
)

from fast_lora_td3.tasks import g1_rewards as r

ACTION_SCALE = 0.25
FOOT_SITES = ("left_foot", "right_foot")
REWARD_WEIGHTS = r.REWARD_WEIGHTS

# Mass scale m' = m·exp(2α) under pseudo-inertia scaling: α = ln(s)/2 gives s ∈ [0.9, 1.1].
_MASS_ALPHA = (0.5 * math.log(0.9), 0.5 * math.log(1.1))


def _observations(stock: dict[str, ObservationGroupCfg]) -> dict[str, ObservationGroupCfg]:
    a = stock["actor"].terms
    phase = ObservationTermCfg(func=r.gait_phase, params={"period_s": r.GAIT_PERIOD_S})
    actor = {
        "base_ang_vel": a["base_ang_vel"],
        "projected_gravity": a["projected_gravity"],
        "command": a["command"],
        "joint_pos": a["joint_pos"],
        "joint_vel": a["joint_vel"],
        "actions": a["actions"],
        "gait_phase": phase,
    }
    critic = {**actor, "joint_pos": ObservationTermCfg(func=mdp.joint_pos_rel)}
    critic["base_lin_vel"] = dataclasses.replace(a["base_lin_vel"], noise=None)
    return {
        "actor": ObservationGroupCfg(terms=actor, concatenate_terms=True, enable_corruption=True),
        "critic": ObservationGroupCfg(
            terms=critic, concatenate_terms=True, enable_corruption=False
        ),
    }


def _rewards() -> dict[str, RewardTermCfg]:
    robot = SceneEntityCfg("robot")
    feet = SceneEntityCfg("robot", site_names=FOOT_SITES)
    w = REWARD_WEIGHTS
    return {
        "track_linear_velocity": RewardTermCfg(
            func=mdp.track_linear_velocity,
            weight=w["track_linear_velocity"],
            params={"command_name": "twist", "std": math.sqrt(0.25)},
        ),
        "track_angular_velocity": RewardTermCfg(
            func=mdp.track_angular_velocity,
            weight=w["track_angular_velocity"],
            params={"command_name": "twist", "std": math.sqrt(0.5)},
        ),
        "feet_phase": RewardTermCfg(
            func=r.feet_phase,
            weight=w["feet_phase"],
            params={"command_name": "twist", "sensor_name": "foot_height_scan"},
        ),
        "alive": RewardTermCfg(func=envs_mdp.is_alive, weight=w["alive"]),
        "ang_vel_xy": RewardTermCfg(
            func=r.ang_vel_xy_l2, weight=w["ang_vel_xy"], params={"asset_cfg": robot}
        ),
        "orientation": RewardTermCfg(func=envs_mdp.flat_orientation_l2, weight=w["orientation"]),
        "action_rate": RewardTermCfg(func=envs_mdp.action_rate_l2, weight=w["action_rate"]),
        "pose": RewardTermCfg(
            func=r.pose_l2,
            weight=w["pose"],
            params={"asset_cfg": SceneEntityCfg("robot", joint_names=(".*",))},
        ),
        "feet_too_close": RewardTermCfg(
            func=r.feet_too_close,
            weight=w["feet_too_close"],
            params={"asset_cfg": feet, "min_separation": 0.15},
        ),
        "foot_orientation": RewardTermCfg(
            func=r.foot_orientation, weight=w["foot_orientation"], params={"asset_cfg": feet}
        ),
    }


def _events(cfg: ManagerBasedRlEnvCfg) -> None:
    push = cfg.events.get("push_robot")  # the stock play config has no pushes
    if push is not None:
        push.interval_range_s = (5.0, 10.0)
        push.params["velocity_range"] = {"x": (-1.0, 1.0), "y": (-1.0, 1.0)}
    cfg.events["pd_gains"] = EventTermCfg(
        func=dr.pd_gains,
        mode="reset",
        params={
            "kp_range": (0.9, 1.1),
            "kd_range": (0.9, 1.1),
            "asset_cfg": SceneEntityCfg("robot"),
        },
    )
    cfg.events["base_mass"] = EventTermCfg(
        func=dr.pseudo_inertia,
        mode="startup",
        params={
            "alpha_range": _MASS_ALPHA,
            "asset_cfg": SceneEntityCfg("robot", body_names=("torso_link",)),
        },
    )


def _actuator_delay(cfg: ManagerBasedRlEnvCfg, max_lag_physics_steps: int) -> None:
    robot = cfg.scene.entities["robot"]
    art = robot.articulation
    delayed = tuple(
        dataclasses.replace(a, delay_min_lag=0, delay_max_lag=max_lag_physics_steps)
        for a in art.actuators
    )
    robot.articulation = dataclasses.replace(art, actuators=delayed)


def fastlora_g1_env_cfg(rough: bool = False, play: bool = False) -> ManagerBasedRlEnvCfg:
    """The off-policy G1 velocity config (flat or rough terrain; ``play`` = evaluation variant)."""
    cfg = unitree_g1_rough_env_cfg(play=play) if rough else unitree_g1_flat_env_cfg(play=play)
    cfg.sim.mujoco.timestep = 0.005  # 200 Hz physics
    cfg.decimation = 4  # 50 Hz policy
    if not play:
        cfg.episode_length_s = 20.0
    action = cfg.actions["joint_pos"]
    assert isinstance(action, JointPositionActionCfg)
    action.scale = ACTION_SCALE
    cfg.observations = _observations(cfg.observations)
    if play:
        cfg.observations["actor"].enable_corruption = False
    cfg.rewards = _rewards()
    _events(cfg)
    _actuator_delay(cfg, max_lag_physics_steps=cfg.decimation)
    cfg.curriculum.pop("command_vel", None)
    return cfg
