"""The off-policy G1 velocity task as Isaac Lab 2.3 config classes. NOT run here (no GPU).

Import-safe: nothing from Isaac Lab is imported at module import. The config classes
``G1FlatOffPolicyEnvCfg`` / ``G1RoughOffPolicyEnvCfg`` are built on first attribute access
(PEP 562 ``__getattr__``), which happens when Isaac Lab's ``parse_env_cfg`` resolves the
``env_cfg_entry_point`` string, i.e. after ``AppLauncher`` has started Isaac Sim.

Every Isaac Lab name used here is listed in ``ISAACLAB_NAMES`` and resolved against the real 2.3.2
source by ``scripts/isaaclab_conformance.py``. Reward and observation terms carry the names of the
mjlab task's terms (``tasks/g1_velocity.py``); ``REWARD_TERMS`` / ``OBSERVATION_TERMS`` list the
correspondence. Differences from the mjlab variant: the G1 is Isaac Lab's 37-DoF ``G1_MINIMAL_CFG``
(with hands); feet are the ankle-roll bodies (Isaac Lab has no foot sites) and foot height is the
body height above the env origin minus its standing height (exact on flat ground only); the
0–1 step action delay is not applied (Isaac Lab models it with ``DelayedPDActuatorCfg``, which
would replace the G1's implicit actuators). Isaac Lab 3.0 is refused for these tasks: their terms
read asset data as torch tensors, and 3.0 exposes Warp arrays (``.torch``) and moved the stock
G1 configs to ``isaaclab_tasks.core``.
"""

from __future__ import annotations

import math
from typing import Any

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.tasks import g1_rewards as r

ISAACLAB_TASK_IDS = {
    "FastLoRA-Isaac-Velocity-Flat-G1-v0": "G1FlatOffPolicyEnvCfg",
    "FastLoRA-Isaac-Velocity-Rough-G1-v0": "G1RoughOffPolicyEnvCfg",
}
FEET_BODIES = ("left_ankle_roll_link", "right_ankle_roll_link")
MASS_BODY = "torso_link"
FOOT_STANDING_HEIGHT = 0.035  # ankle-roll body origin above the sole (approximate, G1 USD)
_CLASSES: dict[str, Any] = {}
_G1 = "isaaclab_tasks.manager_based.locomotion.velocity.config.g1"
_VEL = "isaaclab_tasks.manager_based.locomotion.velocity.velocity_env_cfg"
_DATA = "isaaclab.assets.articulation.articulation_data:ArticulationData"

REWARD_TERMS = {
    "track_linear_velocity": "isaaclab.envs.mdp:track_lin_vel_xy_exp",
    "track_angular_velocity": "isaaclab.envs.mdp:track_ang_vel_z_exp",
    "feet_phase": "isaac_feet_phase",
    "alive": "isaaclab.envs.mdp:is_alive",
    "ang_vel_xy": "isaaclab.envs.mdp:ang_vel_xy_l2",
    "orientation": "isaaclab.envs.mdp:flat_orientation_l2",
    "action_rate": "isaaclab.envs.mdp:action_rate_l2",
    "pose": "isaac_pose_l2",
    "feet_too_close": "isaac_feet_too_close",
    "foot_orientation": "isaac_foot_orientation",
}
"""mjlab reward term (tasks/g1_velocity.py, same name here) → the Isaac Lab function computing it."""

OBSERVATION_TERMS = {
    "base_ang_vel": "isaaclab.envs.mdp:base_ang_vel",
    "projected_gravity": "isaaclab.envs.mdp:projected_gravity",
    "command": "isaaclab.envs.mdp:generated_commands",
    "joint_pos": "isaaclab.envs.mdp:joint_pos_rel",
    "joint_vel": "isaaclab.envs.mdp:joint_vel_rel",
    "actions": "isaaclab.envs.mdp:last_action",
    "gait_phase": "isaac_gait_phase",
    "base_lin_vel": "isaaclab.envs.mdp:base_lin_vel",
}
"""mjlab observation term (actor, then critic-only ``base_lin_vel``) → Isaac Lab function."""

ISAACLAB_NAMES: dict[str, list[tuple[str, ...]]] = {
    "2.3": [
        ("exists", f"{_G1}.flat_env_cfg:G1FlatEnvCfg"),
        ("exists", f"{_G1}.rough_env_cfg:G1RoughEnvCfg"),
        ("exists", "isaaclab_assets:G1_MINIMAL_CFG"),
        ("regex_names", f"{_G1}.rough_env_cfg", *FEET_BODIES, MASS_BODY),
        ("strings", _G1, "Isaac-Velocity-Flat-G1-v0", "Isaac-Velocity-Rough-G1-v0"),
        *[
            ("exists", f"isaaclab.managers:{c}")
            for c in (
                "EventTermCfg",
                "ObservationGroupCfg",
                "ObservationTermCfg",
                "RewardTermCfg",
                "SceneEntityCfg",
            )
        ],
        ("params", "isaaclab.managers:SceneEntityCfg", "name", "body_names", "joint_names"),
        ("exists", "isaaclab.managers:SceneEntityCfg.body_ids"),
        ("exists", "isaaclab.utils:configclass"),
        ("params", "isaaclab.utils.noise:AdditiveUniformNoiseCfg", "n_min", "n_max"),
        ("params", "isaaclab.utils.math:quat_apply_inverse", "quat", "vec"),
        *[
            ("field", f"isaaclab.managers:{c}", f)
            for c, f in (
                ("ObservationTermCfg", "func"),
                ("ObservationTermCfg", "params"),
                ("ObservationTermCfg", "noise"),
                ("ObservationGroupCfg", "enable_corruption"),
                ("ObservationGroupCfg", "concatenate_terms"),
                ("RewardTermCfg", "weight"),
                ("RewardTermCfg", "params"),
                ("EventTermCfg", "mode"),
                ("EventTermCfg", "interval_range_s"),
            )
        ],
        *[
            ("field", f"{_G1}.rough_env_cfg:G1RoughEnvCfg", f)
            for f in (
                "sim.dt",
                "decimation",
                "episode_length_s",
                "actions.joint_pos.scale",
                "observations.policy",
                "rewards",
                "events",
                "scene.robot",
                "scene.contact_forces",
                "commands.base_velocity",
                "terminations.time_out",
            )
        ],
        # Fields we modify in place must not be disabled (= None) by the stock __post_init__.
        *[
            ("not_none", f"{_G1}.{cls}", f)
            for cls in ("flat_env_cfg:G1FlatEnvCfg", "rough_env_cfg:G1RoughEnvCfg")
            for f in ("actions.joint_pos", "observations", "events", "sim")
        ],
        ("strings", f"{_VEL}:EventCfg", "interval"),
        ("exists", "isaaclab.envs:ManagerBasedRLEnv.command_manager"),
        ("exists", "isaaclab.managers:CommandManager.get_command"),
        ("exists", "isaaclab.scene:InteractiveScene.env_origins"),
        *[
            ("exists", f"{_DATA}.{a}")
            for a in ("body_pos_w", "body_quat_w", "heading_w", "joint_pos", "default_joint_pos")
        ],
    ],
}
"""Isaac Lab names this module relies on (beyond the ``func=mdp.X, params=…`` pairs, which the
conformance script parses from this file), as checks for ``scripts/isaaclab_conformance.py``."""


def check_isaaclab_version(task: str, version: tuple[int, int]) -> None:
    """Refuse our FastLoRA Isaac tasks on Isaac Lab ≥ 3.0 with a one-line ConfigError."""
    if task in ISAACLAB_TASK_IDS and version >= (3, 0):
        raise ConfigError(
            f"env.task={task!r} needs Isaac Lab 2.3 (found {version[0]}.{version[1]}: its "
            "asset data are Warp arrays and the stock G1 configs moved); on 3.0 use "
            "env.task=Isaac-Velocity-Flat-G1 (stock, no critic group)"
        )


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


# Isaac Lab term functions around the shared pure functions of g1_rewards (torch tensors: 2.3).


def _feet(env: Any, asset_cfg: Any) -> tuple[Any, Any]:
    asset = env.scene[asset_cfg.name]
    return asset, asset_cfg.body_ids


def isaac_feet_phase(env: Any, command_name: str, asset_cfg: Any) -> Any:
    """Feet-phase reward from ankle-body heights above the env origin (flat ground)."""
    asset, ids = _feet(env, asset_cfg)
    heights = (
        asset.data.body_pos_w[:, ids, 2] - env.scene.env_origins[:, 2:3] - FOOT_STANDING_HEIGHT
    )
    phase = r.gait_phase_from(env.episode_length_buf.float() * env.step_dt)
    return r.feet_phase_reward_from(heights, phase, env.command_manager.get_command(command_name))


def isaac_gait_phase(env: Any) -> Any:
    """Observation: sin/cos of the gait phase (clock = the episode step counter)."""
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
    from fast_lora_td3.envs.isaaclab_names import isaaclab_version

    task = next(t for t, c in ISAACLAB_TASK_IDS.items() if c == ISAACLAB_TASK_IDS_CLASS[rough])
    check_isaaclab_version(task, isaaclab_version())  # before the 2.3-only imports below
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
    robot = SceneEntityCfg("robot")
    w = r.REWARD_WEIGHTS

    @configclass
    class PolicyCfg(ObsGroup):
        base_ang_vel = ObsTerm(func=mdp.base_ang_vel, noise=Unoise(n_min=-0.2, n_max=0.2))
        projected_gravity = ObsTerm(
            func=mdp.projected_gravity, noise=Unoise(n_min=-0.05, n_max=0.05)
        )
        command = ObsTerm(func=mdp.generated_commands, params={"command_name": "base_velocity"})
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
    class RewardsCfg:
        track_linear_velocity = RewTerm(
            func=mdp.track_lin_vel_xy_exp,
            weight=w["track_linear_velocity"],
            params={"command_name": "base_velocity", "std": math.sqrt(0.25)},
        )
        track_angular_velocity = RewTerm(
            func=mdp.track_ang_vel_z_exp,
            weight=w["track_angular_velocity"],
            params={"command_name": "base_velocity", "std": math.sqrt(0.5)},
        )
        feet_phase = RewTerm(
            func=isaac_feet_phase,
            weight=w["feet_phase"],
            params={"command_name": "base_velocity", "asset_cfg": feet},
        )
        alive = RewTerm(func=mdp.is_alive, weight=w["alive"])
        ang_vel_xy = RewTerm(func=mdp.ang_vel_xy_l2, weight=w["ang_vel_xy"])
        orientation = RewTerm(func=mdp.flat_orientation_l2, weight=w["orientation"])
        action_rate = RewTerm(func=mdp.action_rate_l2, weight=w["action_rate"])
        pose = RewTerm(func=isaac_pose_l2, weight=w["pose"], params={"asset_cfg": robot})
        feet_too_close = RewTerm(
            func=isaac_feet_too_close,
            weight=w["feet_too_close"],
            params={"asset_cfg": feet, "min_separation": 0.15},
        )
        foot_orientation = RewTerm(
            func=isaac_foot_orientation, weight=w["foot_orientation"], params={"asset_cfg": feet}
        )

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
            self.rewards = RewardsCfg()
            ev = self.events
            # G1RoughEnvCfg sets push_robot and add_base_mass to None: create them here.
            ev.push_robot = EventTerm(
                func=mdp.push_by_setting_velocity,
                mode="interval",
                interval_range_s=(5.0, 10.0),
                params={"velocity_range": {"x": (-1.0, 1.0), "y": (-1.0, 1.0)}},
            )
            ev.add_base_mass = EventTerm(
                func=mdp.randomize_rigid_body_mass,
                mode="startup",
                params={
                    "asset_cfg": SceneEntityCfg("robot", body_names=[MASS_BODY]),
                    "mass_distribution_params": (0.9, 1.1),
                    "operation": "scale",
                    "recompute_inertia": True,
                },
            )
            ev.physics_material = EventTerm(
                func=mdp.randomize_rigid_body_material,
                mode="startup",
                params={
                    "asset_cfg": feet,
                    "static_friction_range": (0.3, 1.2),
                    "dynamic_friction_range": (0.3, 1.2),
                    "restitution_range": (0.0, 0.0),
                    "num_buckets": 64,
                },
            )
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

    OffPolicyG1Cfg.__name__ = ISAACLAB_TASK_IDS_CLASS[rough]
    return OffPolicyG1Cfg


ISAACLAB_TASK_IDS_CLASS = {False: "G1FlatOffPolicyEnvCfg", True: "G1RoughOffPolicyEnvCfg"}


def __getattr__(name: str) -> Any:
    """Build ``G1FlatOffPolicyEnvCfg`` / ``G1RoughOffPolicyEnvCfg`` lazily (needs Isaac Lab)."""
    for rough, cls_name in ISAACLAB_TASK_IDS_CLASS.items():
        if name == cls_name:
            if name not in _CLASSES:
                _CLASSES[name] = _build(rough)
            return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
