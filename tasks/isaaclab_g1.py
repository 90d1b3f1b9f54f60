"""The off-policy G1 velocity task (SPEC §4.4) as Isaac Lab config classes. NOT run here (no GPU).

Import-safe: nothing from Isaac Lab is imported at module import. The config classes
``G1FlatOffPolicyEnvCfg`` / ``G1RoughOffPolicyEnvCfg`` are built on first attribute access
(PEP 562 ``__getattr__``), which happens when Isaac Lab's ``parse_env_cfg`` resolves the
``env_cfg_entry_point`` string, i.e. after ``AppLauncher`` has started Isaac Sim.

Differences from the mjlab variant: feet are the ankle-roll bodies (Isaac Lab has no foot sites),
foot height is the body height above the env origin minus its standing height (exact on flat
ground only), and the 0–1 step action delay is not applied (Isaac Lab models it with
``DelayedPDActuatorCfg``, which would replace the G1's implicit actuators).
"""

from __future__ import annotations

import math
from typing import Any

from fast_lora_td3.tasks import g1_rewards as r

ISAACLAB_TASK_IDS = {
    "FastLoRA-Isaac-Velocity-Flat-G1-v0": "G1FlatOffPolicyEnvCfg",
    "FastLoRA-Isaac-Velocity-Rough-G1-v0": "G1RoughOffPolicyEnvCfg",
}
FEET_BODIES = ("left_ankle_roll_link", "right_ankle_roll_link")
FOOT_STANDING_HEIGHT = 0.035  # ankle-roll body origin above the sole (approximate, G1 USD)
_CLASSES: dict[str, Any] = {}


def register_isaaclab_tasks() -> None:
    """``gym.register`` our Isaac Lab task ids (idempotent); call after AppLauncher."""
    import gymnasium as gym

    for task_id, cls_name in ISAACLAB_TASK_IDS.items():
        if task_id in gym.registry:
            continue
        gym.register(
            id=task_id,
            entry_point="isaaclab.envs:ManagerBasedRLEnv",
            disable_env_checker=True,
            kwargs={"env_cfg_entry_point": f"{__name__}:{cls_name}"},
        )


# Isaac Lab reward wrappers around the shared pure functions of g1_rewards.


def _feet(env: Any, asset_cfg: Any) -> tuple[Any, Any]:
    asset = env.scene[asset_cfg.name]
    return asset, asset_cfg.body_ids


def isaac_feet_phase(env: Any, command_name: str, asset_cfg: Any) -> Any:
    """Feet-phase reward from ankle-body heights above the env origin (flat ground)."""
    asset, ids = _feet(env, asset_cfg)
    heights = (
        asset.data.body_pos_w[:, ids, 2] - env.scene.env_origins[:, 2:3] - FOOT_STANDING_HEIGHT
    )
    time_s = env.episode_length_buf.float() * env.step_dt
    phase = r.gait_phase_from(time_s)
    return r.feet_phase_reward_from(heights, phase, env.command_manager.get_command(command_name))


def isaac_gait_phase(env: Any) -> Any:
    """Observation: sin/cos of the gait phase."""
    return r.gait_phase_obs_from(r.gait_phase_from(env.episode_length_buf.float() * env.step_dt))


def isaac_feet_too_close(env: Any, asset_cfg: Any, min_separation: float = 0.15) -> Any:
    """Penalty: lateral separation of the ankle bodies below ``min_separation``."""
    asset, ids = _feet(env, asset_cfg)
    pos = asset.data.body_pos_w[:, ids, :2]
    return r.feet_too_close_penalty_from(pos[:, 0], pos[:, 1], asset.data.heading_w, min_separation)


def isaac_foot_orientation(env: Any, asset_cfg: Any) -> Any:
    """Penalty: tilt of the ankle bodies (gravity in each foot frame)."""
    import torch
    from isaaclab.utils.math import quat_apply_inverse

    asset, ids = _feet(env, asset_cfg)
    quat = asset.data.body_quat_w[:, ids]
    gravity = torch.tensor([0.0, 0.0, -1.0], device=quat.device).expand(*quat.shape[:-1], 3)
    return r.foot_tilt_penalty_from(quat_apply_inverse(quat, gravity))


def isaac_pose_l2(env: Any, asset_cfg: Any) -> Any:
    """Penalty: Σ (q - q_default)²."""
    asset = env.scene[asset_cfg.name]
    return r.squared_norm_from(asset.data.joint_pos - asset.data.default_joint_pos)


def _build(rough: bool) -> Any:
    """Create the config class (Isaac Lab imports happen here, after the app started)."""
    import isaaclab.envs.mdp as mdp
    from isaaclab.managers import EventTermCfg as EventTerm
    from isaaclab.managers import ObservationGroupCfg as ObsGroup
    from isaaclab.managers import ObservationTermCfg as ObsTerm
    from isaaclab.managers import RewardTermCfg as RewTerm
    from isaaclab.managers import SceneEntityCfg
    from isaaclab.utils import configclass
    from isaaclab.utils.noise import AdditiveUniformNoiseCfg as Unoise
    from isaaclab_tasks.manager_based.locomotion.velocity.config.g1.flat_env_cfg import G1FlatEnvCfg
    from isaaclab_tasks.manager_based.locomotion.velocity.config.g1.rough_env_cfg import (
        G1RoughEnvCfg,
    )

    base = G1RoughEnvCfg if rough else G1FlatEnvCfg
    feet = SceneEntityCfg("robot", body_names=list(FEET_BODIES))
    cmd = {"command_name": "base_velocity"}

    @configclass
    class PolicyCfg(ObsGroup):
        base_ang_vel = ObsTerm(func=mdp.base_ang_vel, noise=Unoise(n_min=-0.2, n_max=0.2))
        projected_gravity = ObsTerm(
            func=mdp.projected_gravity, noise=Unoise(n_min=-0.05, n_max=0.05)
        )
        velocity_commands = ObsTerm(func=mdp.generated_commands, params=cmd)
        joint_pos = ObsTerm(func=mdp.joint_pos_rel, noise=Unoise(n_min=-0.01, n_max=0.01))
        joint_vel = ObsTerm(func=mdp.joint_vel_rel, noise=Unoise(n_min=-1.5, n_max=1.5))
        actions = ObsTerm(func=mdp.last_action)
        gait_phase = ObsTerm(func=isaac_gait_phase)

        def __post_init__(self) -> None:
            self.enable_corruption = True
            self.concatenate_terms = True

    @configclass
    class CriticCfg(PolicyCfg):
        base_lin_vel = ObsTerm(func=mdp.base_lin_vel)

        def __post_init__(self) -> None:
            self.enable_corruption = False
            self.concatenate_terms = True

    @configclass
    class OffPolicyG1Cfg(base):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.sim.dt = 0.005  # 200 Hz physics, 50 Hz policy
            self.decimation = 4
            self.episode_length_s = 20.0
            self.actions.joint_pos.scale = 0.25
            self.observations.policy = PolicyCfg()
            self.observations.critic = CriticCfg()
            rw = self.rewards
            for name in list(vars(rw)):  # drop the PPO reward set; ours follows
                setattr(rw, name, None)
            w = r_weights()
            rw.track_lin_vel_xy_exp = RewTerm(
                func=mdp.track_lin_vel_xy_exp,
                weight=w["track_linear_velocity"],
                params={**cmd, "std": math.sqrt(0.25)},
            )
            rw.track_ang_vel_z_exp = RewTerm(
                func=mdp.track_ang_vel_z_exp,
                weight=w["track_angular_velocity"],
                params={**cmd, "std": math.sqrt(0.5)},
            )
            rw.feet_phase = RewTerm(
                func=isaac_feet_phase, weight=w["feet_phase"], params={**cmd, "asset_cfg": feet}
            )
            rw.alive = RewTerm(func=mdp.is_alive, weight=w["alive"])
            rw.ang_vel_xy_l2 = RewTerm(func=mdp.ang_vel_xy_l2, weight=w["ang_vel_xy"])
            rw.flat_orientation_l2 = RewTerm(func=mdp.flat_orientation_l2, weight=w["orientation"])
            rw.action_rate_l2 = RewTerm(func=mdp.action_rate_l2, weight=w["action_rate"])
            rw.pose = RewTerm(
                func=isaac_pose_l2, weight=w["pose"], params={"asset_cfg": SceneEntityCfg("robot")}
            )
            rw.feet_too_close = RewTerm(
                func=isaac_feet_too_close, weight=w["feet_too_close"], params={"asset_cfg": feet}
            )
            rw.foot_orientation = RewTerm(
                func=isaac_foot_orientation,
                weight=w["foot_orientation"],
                params={"asset_cfg": feet},
            )
            ev = self.events
            ev.push_robot.interval_range_s = (5.0, 10.0)
            ev.push_robot.params["velocity_range"] = {"x": (-1.0, 1.0), "y": (-1.0, 1.0)}
            ev.actuator_gains = EventTerm(
                func=mdp.randomize_actuator_gains,
                mode="reset",
                params={
                    "asset_cfg": SceneEntityCfg("robot", joint_names=[".*"]),
                    "stiffness_distribution_params": (0.9, 1.1),
                    "damping_distribution_params": (0.9, 1.1),
                    "operation": "scale",
                },
            )
            if getattr(ev, "add_base_mass", None) is not None:
                ev.add_base_mass.params["mass_distribution_params"] = (0.9, 1.1)
                ev.add_base_mass.params["operation"] = "scale"

    OffPolicyG1Cfg.__name__ = ISAACLAB_TASK_IDS_CLASS[rough]
    return OffPolicyG1Cfg


ISAACLAB_TASK_IDS_CLASS = {False: "G1FlatOffPolicyEnvCfg", True: "G1RoughOffPolicyEnvCfg"}


def r_weights() -> dict[str, float]:
    """The SPEC §4.4 reward weights, shared with the mjlab task."""
    return r.REWARD_WEIGHTS


def __getattr__(name: str) -> Any:
    """Build ``G1FlatOffPolicyEnvCfg`` / ``G1RoughOffPolicyEnvCfg`` lazily (needs Isaac Lab)."""
    for rough, cls_name in ISAACLAB_TASK_IDS_CLASS.items():
        if name == cls_name:
            if name not in _CLASSES:
                _CLASSES[name] = _build(rough)
            return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
