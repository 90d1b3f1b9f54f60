"""Every Isaac Lab name ``fast_lora_td3/envs/isaaclab_env.py`` relies on, per Isaac Lab version.

Checks for ``scripts/isaaclab_conformance.py``, which resolves them by AST in the real wheels:
``(kind, "module:Name.attr", *args)`` with kind ``exists``, ``params`` (parameter names),
``field`` (dotted config-field path), ``strings`` (string literals in the definition),
``calls_in_order`` and ``returns``. The G1 task's list is ``fast_lora_td3.tasks.isaaclab_g1.ISAACLAB_NAMES``.
"""

from __future__ import annotations

import importlib.metadata

_ENV = "isaaclab.envs.manager_based_rl_env:ManagerBasedRLEnv"
_STEP_RETURN = (
    "(self.obs_buf, self.reward_buf, self.reset_terminated, self.reset_time_outs, self.extras)"
)
ISAACLAB_NAMES: dict[str, list[tuple[str, ...]]] = {
    "2.3": [
        ("exists", "isaaclab.app:AppLauncher"),
        ("exists", "isaaclab.app:AppLauncher.app"),
        (
            "strings",
            "isaaclab.app.app_launcher:AppLauncher._APPLAUNCHER_CFG_INFO",
            "headless",
            "device",
            "enable_cameras",
        ),
        (
            "strings",
            "isaaclab.app.app_launcher:AppLauncher._resolve_device_settings",
            "distributed",
        ),
        ("exists", "isaaclab_tasks"),
        ("params", "isaaclab_tasks.utils:parse_env_cfg", "task_name", "device", "num_envs"),
        (
            "strings",
            "isaaclab_tasks.manager_based.locomotion.velocity.config.g1",
            "Isaac-Velocity-Flat-G1-v0",
            "Isaac-Velocity-Rough-G1-v0",
            "env_cfg_entry_point",
        ),
        ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", "seed"),
        ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", "episode_length_s"),
        ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", "is_finite_horizon"),
        ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", "scene.num_envs"),
        ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", "sim.device"),
        *[
            ("exists", f"{_ENV}.{a}")
            for a in (
                "step",
                "_reset_idx",
                "reset",
                "seed",
                "render",
                "close",
                "num_envs",
                "device",
                "max_episode_length",
                "step_dt",
                "single_action_space",
                "episode_length_buf",
                "observation_manager",
                "action_manager",
                "extras",
                "cfg",
            )
        ],
        (
            "calls_in_order",
            f"{_ENV}.step",
            "action_manager.process_action",
            "termination_manager.compute",
            "reward_manager.compute",
            "_reset_idx",
            "command_manager.compute",
            "observation_manager.compute",
        ),
        ("returns", f"{_ENV}.step", _STEP_RETURN),
        ("strings", f"{_ENV}._reset_idx", "log"),
        (
            "calls_in_order",
            f"{_ENV}._reset_idx",
            "scene.reset",
            "observation_manager.reset",
            "action_manager.reset",
            "command_manager.reset",
        ),
        ("params", "isaaclab.managers:ObservationManager.compute", "update_history"),
        *[
            ("exists", f"isaaclab.managers:ObservationManager.{a}")
            for a in ("active_terms", "group_obs_term_dim", "_group_obs_term_cfgs")
        ],
        *[
            ("field", "isaaclab.managers:ObservationTermCfg", f)
            for f in ("func", "history_length", "modifiers", "noise")
        ],
        ("field", "isaaclab.utils.modifiers:ModifierCfg", "func"),
        *[
            ("exists", f"isaaclab.utils.modifiers:{c}")
            for c in ("ModifierBase", "DigitalFilter", "Integrator")
        ],
        ("exists", "isaaclab.managers:ActionManager.get_term"),
        *[
            ("exists", f"isaaclab.envs.mdp.actions.joint_actions:JointAction.{a}")
            for a in ("_joint_names", "_joint_ids", "_scale", "_asset")
        ],
        *[
            ("field", "isaaclab.assets.articulation.articulation_data:ArticulationData", a)
            for a in ("default_joint_pos", "joint_stiffness", "joint_damping")
        ],
    ],
    "3.0": [
        ("exists", "isaaclab.app:AppLauncher"),
        ("strings", "isaaclab.app.sim_launcher", "enable_cameras", "distributed", "device"),
        ("exists", "isaaclab_tasks"),
        ("params", "isaaclab_tasks.utils:parse_env_cfg", "task_name", "device", "num_envs"),
        (
            "strings",
            "isaaclab_tasks.core.velocity.config.g1",
            "Isaac-Velocity-Flat-G1",
            "Isaac-Velocity-Rough-G1",
        ),
        *[
            ("field", "isaaclab.envs:ManagerBasedRLEnvCfg", f)
            for f in ("compute_final_obs", "seed", "episode_length_s", "is_finite_horizon")
        ],
        *[
            ("exists", f"{_ENV}.{a}")
            for a in (
                "step",
                "_reset_idx",
                "seed",
                "num_envs",
                "device",
                "max_episode_length",
                "step_dt",
                "single_action_space",
                "episode_length_buf",
                "observation_manager",
                "extras",
            )
        ],
        ("strings", f"{_ENV}.step", "final_obs"),
        ("strings", f"{_ENV}._reset_idx", "log"),
        (
            "calls_in_order",
            f"{_ENV}.step",
            "reward_manager.compute",
            "observation_manager.compute",
            "_reset_idx",
            "observation_manager.compute",
        ),
        ("returns", f"{_ENV}.step", _STEP_RETURN),
    ],
}
"""version key ("2.3", "3.0") → checks."""


def isaaclab_version() -> tuple[int, int]:
    """(major, minor) of the installed ``isaaclab`` distribution; (0, 0) if unknown."""
    try:
        parts = importlib.metadata.version("isaaclab").split(".")
        return int(parts[0]), int(parts[1])
    except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
        return (0, 0)
