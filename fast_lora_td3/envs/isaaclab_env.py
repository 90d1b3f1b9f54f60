# Over 400 lines: the env adapter and the Kit app life cycle share the process-global _APP.
"""Isaac Lab backend. Nothing here imports ``isaaclab`` at module import time.

Start-up follows Isaac Lab's own ``scripts/reinforcement_learning/rsl_rl/train.py``: one
``AppLauncher`` per process (``headless``, ``device``, ``enable_cameras`` only when frames are
rendered, ``distributed`` under torchrun) before any other ``isaaclab.*`` import, then
``parse_env_cfg(task, device=, num_envs=)``, ``cfg.seed``, ``gym.make(task, cfg=, render_mode=)``.
The Kit app lives until the very end of the process: ``finish_simulation_app(exit_code)`` closes it
as the last act of ``fast_lora_td3.cli.main`` (``SimulationApp.close()`` can end the process with
status 0 or hang, so it never runs before an error is printed, and never on failure).

True final observations. 2.3's ``ManagerBasedRLEnv.step`` computes terminations and
rewards, resets done envs with ``_reset_idx(ids)``, updates commands and interval events, and only
then computes ``obs_buf`` (``update_history=True``): the observation it returns for a done env is
the first of the next episode, and ``extras`` has only ``"log"`` (``"time_outs"`` is added by the
RL-library wrappers, not by the env; the time-outs are step()'s 4th return value).

1. Isaac Lab ≥ 3.0: ``env_cfg.compute_final_obs = True`` → ``extras["final_obs"]``, computed by
   ``observation_manager.compute()`` right before ``_reset_idx``. The key lingers across steps, so
   rows are taken only where this step's done mask is set.
2. Isaac Lab 2.3: the same computation, by wrapping ``_reset_idx`` on the instance; only calls
   made inside ``step()`` capture. Like 3.0's, the captured observation holds the command before
   this step's command update and no interval event (push) of this step. Refused (see 3.) for
   tasks where a second ``compute()`` is not the terminal observation or changes later ones: terms with ``history_length > 0`` (the history
   is not appended without ``update_history``), stateful modifiers (``DigitalFilter``,
   ``Integrator``: class modifiers advance once more for every env) and class-based terms. Noise
   draws extra random numbers for all envs: the final observation carries its own noise sample,
   and the torch RNG stream after it differs from an unhooked run (still seeded, reproducible).
3. No exact path: time-outs are treated as terminations (no bootstrap, never from a reset
   observation); an error is logged once and ``info["final_obs_exact"]`` is False. This also
   happens at run time if, during the first episode (one host read per step, then none), a step
   resets envs without producing a final observation (an Isaac Lab whose ``step()`` no longer
   resets through ``_reset_idx``, or no fresh ``extras["final_obs"]``).
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fast_lora_td3.envs.base import StepResult, group_tensor, select_done, unknown_task_error
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.envs.isaaclab_names import isaaclab_version
from fast_lora_td3.errors import ConfigError

log = logging.getLogger(__name__)

POLICY_GROUP = "policy"
CRITIC_GROUP = "critic"
APP_CLOSE_TIMEOUT_S = 60.0
"""How long ``SimulationApp.close()`` may take before the process exits anyway."""

_APP: Any = None
"""The process's one Kit app (Isaac Sim allows one simulation context per process)."""


def resolve_task_id(task: str, registered: Any) -> str | None:
    """``task`` as registered, accepting ids with or without ``-v0`` (3.0 dropped the suffix)."""
    for candidate in (task, task.removesuffix("-v0"), f"{task}-v0"):
        if candidate in registered:
            return candidate
    return None


def app_launcher_kwargs(cfg: EnvConfig, world_size: int) -> dict[str, Any]:
    """AppLauncher arguments as Isaac Lab's rsl_rl train.py passes them (cameras only to render)."""
    kwargs: dict[str, Any] = {
        "headless": True,
        "device": cfg.device,
        "enable_cameras": bool(cfg.video or cfg.render_mode),
    }
    if world_size > 1:
        kwargs["distributed"] = True  # Kit renders/simulates on GPU LOCAL_RANK
    return kwargs


def launch_app(cfg: EnvConfig) -> Any:
    """Start the process's Kit app once (later calls return it); needs ``isaaclab``."""
    global _APP
    if _APP is None:
        from isaaclab.app import AppLauncher  # the only isaaclab import allowed before the app

        from fast_lora_td3.envs.launch import world_size_from_environment

        world_size = world_size_from_environment()
        if world_size > 1 and "SLURM_LOCALID" in os.environ:  # srun: AppLauncher reads LOCAL_RANK
            os.environ.setdefault("LOCAL_RANK", os.environ["SLURM_LOCALID"])
        _APP = AppLauncher(**app_launcher_kwargs(cfg, world_size)).app
    return _APP


def finish_simulation_app(exit_code: int) -> int:
    """The last act of ``main``: close the Kit app (if one was started) and end the process with
    ``exit_code``. Without an app it just returns ``exit_code``.

    ``SimulationApp.close()`` may exit the process with status 0 or hang, so it runs only after a
    successful run, after stdout/stderr are flushed, under a watchdog that exits with
    ``exit_code`` after ``APP_CLOSE_TIMEOUT_S``; a failed run exits without closing Kit.
    """
    global _APP
    app, _APP = _APP, None
    if app is None:
        return exit_code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_code == 0:
        watchdog = threading.Timer(APP_CLOSE_TIMEOUT_S, os._exit, args=(exit_code,))
        watchdog.daemon = True
        watchdog.start()
        try:
            app.close()
        except BaseException as exc:  # SystemExit from Kit included
            print(f"fast-lora-td3: warning: SimulationApp.close() raised {exc!r}", file=sys.stderr)
        finally:
            watchdog.cancel()  # close() returned: no timer may fire later in this process
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _launch_and_make(cfg: EnvConfig) -> tuple[Any, Any]:
    """Start Isaac Sim headless, then import Isaac Lab and ``gym.make`` the task; returns (env, app).

    Errors propagate with the app left running: ``finish_simulation_app`` ends the process after
    the CLI has printed them."""
    app = launch_app(cfg)
    import gymnasium as gym
    import isaaclab_tasks  # noqa: F401  (registers the stock Isaac-* tasks)
    from isaaclab_tasks.utils import parse_env_cfg

    from fast_lora_td3.tasks.isaaclab_g1 import check_isaaclab_version, register_isaaclab_tasks

    register_isaaclab_tasks()
    task = resolve_task_id(cfg.task, gym.registry)
    if task is None:
        ids = [k for k in gym.registry if k.startswith(("Isaac-", "FastLoRA-"))]
        raise unknown_task_error("isaaclab", cfg.task, ids)
    check_isaaclab_version(task, isaaclab_version())
    env_cfg = parse_env_cfg(task, device=cfg.device, num_envs=cfg.num_envs)
    env_cfg.seed = cfg.seed
    if cfg.episode_length_s is not None:
        env_cfg.episode_length_s = float(cfg.episode_length_s)
    if hasattr(env_cfg, "compute_final_obs"):
        env_cfg.compute_final_obs = True  # Isaac Lab ≥ 3.0: extras["final_obs"]
    render_mode = "rgb_array" if cfg.video else cfg.render_mode
    env = gym.make(task, cfg=env_cfg, render_mode=render_mode)
    return env, app


def final_obs_hook_blockers(observation_manager: Any) -> list[str]:
    """Observation terms for which a pre-reset ``compute()`` is wrong or has side effects."""
    blockers = []
    cfgs = getattr(observation_manager, "_group_obs_term_cfgs", None)
    if cfgs is None:
        return ["observation_manager has no _group_obs_term_cfgs (cannot inspect its terms)"]
    for group, term_cfgs in cfgs.items():
        names = observation_manager.active_terms[group]
        for name, term in zip(names, term_cfgs, strict=True):
            where = f"{group}/{name}"
            if getattr(term, "history_length", 0) > 0:
                blockers.append(f"{where}: history_length={term.history_length} (stale history)")
            for mod in getattr(term, "modifiers", None) or []:
                if not inspect.isfunction(mod.func):
                    blockers.append(f"{where}: stateful modifier {type(mod.func).__name__}")
            if not (inspect.isfunction(term.func) or inspect.ismethod(term.func)):
                blockers.append(f"{where}: class-based term {type(term.func).__name__}")
    return blockers


class IsaacLabVecEnv:
    """``VecEnv`` over an Isaac Lab manager-based RL env (``policy`` / ``critic`` groups).

    ``make_gym_env`` is a seam for tests: given the config it returns ``(gym_env, app_or_None)``
    without starting Isaac Sim.
    """

    single_instance = True
    """One env per process (a second ``ManagerBasedRLEnv`` raises): evaluate on a slice of it."""

    @staticmethod
    def task_ids() -> None:
        """None: Isaac Lab's registry exists only once the app runs (``_launch_and_make`` checks)."""
        return None

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
        self._last_log: Any = None
        self._last_final: Any = None
        self.final_obs_blockers: list[str] = []
        if not self._native_final:
            om = getattr(u, "observation_manager", None)
            if om is None or not hasattr(u, "_reset_idx"):
                self.final_obs_blockers = ["no observation_manager / _reset_idx (direct workflow?)"]
            else:
                self.final_obs_blockers = final_obs_hook_blockers(om)
            if not self.final_obs_blockers:
                self._install_reset_hook(u)
            else:
                log.error(
                    "Isaac Lab task %s: no exact final observation (%s); time-outs are treated as "
                    "terminations (no bootstrap)",
                    self.cfg.task,
                    "; ".join(self.final_obs_blockers),
                )
        self._exact = self._native_final or self._hooked
        # Until the first episode has surely ended, check (one host read per step) that every
        # step that reset envs produced a final observation: fall back loudly if not.
        self._verify_steps = int(u.max_episode_length) + 1
        obs, critic_obs = self.reset(seed=self.cfg.seed)
        if not self.has_critic_obs:  # e.g. the stock Isaac-Velocity-*-G1 tasks
            log.warning(
                "Isaac Lab task %s has no '%s' observation group: the critic sees the policy "
                "observations (FastLoRA-Isaac-* tasks add privileged critic inputs)",
                self.cfg.task,
                CRITIC_GROUP,
            )
        self.obs_dim = int(obs.shape[-1])
        self.critic_obs_dim = int(critic_obs.shape[-1])

    def _install_reset_hook(self, u: Any) -> None:
        """Isaac Lab 2.3: compute the observation of every env right before step() resets some."""
        original = u._reset_idx

        def reset_idx_with_final_obs(env_ids: Any, *args: Any, **kwargs: Any) -> Any:
            if self._in_step:  # only resets triggered inside step() end an episode
                self._captured = u.observation_manager.compute()
            return original(env_ids, *args, **kwargs)

        u._reset_idx = reset_idx_with_final_obs
        self._hooked = True

    def _split(self, obs_dict: dict[str, Any]) -> tuple[Tensor, Tensor]:
        if POLICY_GROUP not in obs_dict:
            raise ConfigError(
                f"env.task={self.cfg.task!r}: Isaac Lab task has no '{POLICY_GROUP}' observation "
                f"group (found {sorted(obs_dict)})"
            )
        obs = group_tensor(obs_dict[POLICY_GROUP], self.num_envs)
        self.has_critic_obs = CRITIC_GROUP in obs_dict
        if not self.has_critic_obs:
            return obs, obs
        return obs, group_tensor(obs_dict[CRITIC_GROUP], self.num_envs)

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env (seeding Isaac Lab's RNGs when given); returns ``(obs, critic_obs)``."""
        if seed is not None and hasattr(self.unwrapped, "seed"):
            self.unwrapped.seed(seed)
        obs_dict, extras = self.env.reset()
        self._last_log = extras.get("log")  # the reset's log is not a step's
        if self.cfg.randomize_episode_start and self.max_episode_length > 1:
            # Decorrelated horizons: envs start part-way into their first episode.
            buf = self.unwrapped.episode_length_buf
            self.unwrapped.episode_length_buf = torch.randint_like(
                buf, high=self.max_episode_length
            )
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
        if self._finite_horizon or not self._exact:
            # A time limit that defines the task, or no true final observation: no bootstrap.
            terminated, truncated = terminated | truncated, torch.zeros_like(truncated)
        done = terminated | truncated
        source = extras.get("final_obs") if self._native_final else self._captured
        if self._native_final:  # the key lingers: only a dict set by this step counts
            source, self._last_final = (source if source is not self._last_final else None), source
        if self._verify_steps > 0 and self._exact:
            self._verify_steps -= 1
            if source is None and bool(done.any()):  # host read, first episode only
                self._final_obs_path_failed()
                terminated, truncated = done, torch.zeros_like(truncated)
        final_obs, final_critic_obs = obs, critic_obs
        if source is not None:
            f_obs, f_critic = self._split(source)
            final_obs = select_done(done, f_obs, obs)
            final_critic_obs = (
                select_done(done, f_critic, critic_obs) if self.has_critic_obs else final_obs
            )
        return StepResult(
            obs=obs,
            critic_obs=critic_obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            final_critic_obs=final_critic_obs,
            info={"log": self._fresh_log(extras), "final_obs_exact": self._exact},
        )

    def _final_obs_path_failed(self) -> None:
        """An env ended but the final-observation path gave nothing: this Isaac Lab does not step
        as the hook (or compute_final_obs) assumes. From now on time-outs are terminations."""
        self._exact = self._hooked = False
        self.final_obs_blockers = ["no final observation on a step that reset envs"]
        log.error(
            "Isaac Lab task %s: an env was reset inside step() without a final observation (%s); "
            "time-outs are treated as terminations from now on (no bootstrap)",
            self.cfg.task,
            "compute_final_obs" if self._native_final else "_reset_idx hook did not run",
        )

    def _fresh_log(self, extras: dict[str, Any]) -> dict[str, Any]:
        """``extras["log"]`` if this step reset envs, else {}: ``_reset_idx`` replaces the dict,
        and 2.3's ``step()`` leaves the previous reset's dict in place otherwise."""
        log_dict = extras.get("log")
        fresh = log_dict is not None and log_dict is not self._last_log
        self._last_log = log_dict
        return dict(log_dict) if fresh else {}

    def render(self) -> Any:
        """An RGB frame when built with ``video=True`` (cameras enabled), else None."""
        return self.env.render()

    def close(self) -> None:
        """Close the env (also at interpreter exit); the Kit app stays up until
        ``finish_simulation_app`` ends the process."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self.env.close()

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
