"""Task definitions shipped as ``fast_lora_td3.tasks``.

Importing this package registers the mjlab tasks ``FastLoRA-Velocity-Flat-G1`` and
``FastLoRA-Velocity-Rough-G1`` in mjlab's registry. The Isaac Lab variant lives in
``fast_lora_td3.tasks.isaaclab_g1`` and is registered by ``register_isaaclab_tasks()`` after
Isaac Sim has started (never at import time).
"""

from __future__ import annotations

import contextlib
import sys

MJLAB_TASK_IDS = {"FastLoRA-Velocity-Flat-G1": False, "FastLoRA-Velocity-Rough-G1": True}
"""Our mjlab task ids → rough terrain?"""


def register_mjlab_tasks() -> None:
    """Register our G1 tasks in mjlab's registry (idempotent)."""
    import mjlab.tasks  # noqa: F401  (stock tasks first: our configs derive from the G1 ones)
    from mjlab.tasks.registry import list_tasks, register_mjlab_task
    from mjlab.tasks.velocity.config.g1.rl_cfg import unitree_g1_ppo_runner_cfg

    from fast_lora_td3.tasks.g1_velocity import fastlora_g1_env_cfg

    known = set(list_tasks())
    for task_id, rough in MJLAB_TASK_IDS.items():
        if task_id in known:
            continue
        register_mjlab_task(
            task_id=task_id,
            env_cfg=fastlora_g1_env_cfg(rough=rough),
            play_env_cfg=fastlora_g1_env_cfg(rough=rough, play=True),
            # mjlab's registry requires a runner config; its PPO one keeps `mjlab play` working.
            rl_cfg=unitree_g1_ppo_runner_cfg(),
        )


# Inside an Isaac Sim process (AppLauncher already imported) only isaaclab_g1 is wanted: importing
# mjlab there would load a second MuJoCo Warp stack next to Isaac Sim's warp.
if not any(m == "isaaclab" or m.startswith("isaaclab.") for m in sys.modules):
    # mjlab missing: make_env reports it with the install command.
    with contextlib.suppress(ImportError):
        register_mjlab_tasks()
