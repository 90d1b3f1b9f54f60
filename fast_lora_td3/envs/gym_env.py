"""gymnasium backend: any registered id through ``gymnasium.make_vec`` in SAME_STEP autoreset mode.

gymnasium 1.x defaults to NEXT_STEP autoreset: the step after a done is a dummy reset step whose
action is ignored. SAME_STEP instead resets inside the step that ended the episode, returns the new
episode's first observation, and puts the true last one in ``info["final_obs"]`` (masked by
``info["_final_obs"]``), which is exactly the ``StepResult`` contract. numpy ↔ torch only here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fast_lora_td3.envs.base import StepResult
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import ConfigError

log = logging.getLogger(__name__)


class GymVecEnv:
    """``VecEnv`` over a gymnasium vector env with a flat ``Box`` observation and ``Box`` action."""

    def __init__(self, cfg: EnvConfig) -> None:
        """Create ``cfg.num_envs`` copies of ``cfg.task`` (simulated on CPU, tensors on ``cfg.device``)."""
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        if cfg.randomize_episode_start:
            log.warning(
                "env.randomize_episode_start is not supported by the gymnasium backend; ignored"
            )
        render_mode = "rgb_array" if cfg.video else cfg.render_mode
        kwargs = {} if render_mode is None else {"render_mode": render_mode}
        self.env = gym.make_vec(
            cfg.task,
            num_envs=cfg.num_envs,
            vectorization_mode=cfg.gym_vectorization_mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **kwargs,
        )
        obs_space = self.env.single_observation_space
        act_space = self.env.single_action_space
        if not isinstance(obs_space, gym.spaces.Box):
            self.env.close()
            raise ConfigError(
                f"env.task={cfg.task!r}: the gymnasium backend needs a Box observation space, "
                f"got {type(obs_space).__name__}"
            )
        if not isinstance(act_space, gym.spaces.Box) or not act_space.is_bounded():
            self.env.close()
            raise ConfigError(
                f"env.task={cfg.task!r}: the gymnasium backend needs a bounded Box action space, "
                f"got {act_space}"
            )
        self.cfg = cfg
        self.num_envs = int(cfg.num_envs)
        self.device = torch.device(cfg.device)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.critic_obs_dim = self.obs_dim
        self.has_critic_obs = False
        self.action_dim = int(np.prod(act_space.shape))
        spec = gym.spec(cfg.task)
        self.max_episode_length = int(spec.max_episode_steps or 0)
        # Affine map [-1, 1] → [low, high], kept as numpy: actions leave torch at the boundary.
        self._act_low = act_space.low.astype(np.float64).reshape(-1)
        self._act_high = act_space.high.astype(np.float64).reshape(-1)
        self._act_shape = act_space.shape
        self.reset(seed=cfg.seed)

    @staticmethod
    def task_ids() -> list[str]:
        """Every id in gymnasium's registry."""
        import gymnasium as gym

        return list(gym.registry)

    def _to_torch(self, x: np.ndarray) -> Tensor:
        t = torch.as_tensor(np.asarray(x, dtype=np.float32).reshape(self.num_envs, -1))
        return t.to(self.device)

    def reset(self, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Reset every env (``seed`` seeds env i with ``seed + i``); returns ``(obs, obs)``."""
        obs, _ = self.env.reset(seed=seed)
        o = self._to_torch(obs)
        return o, o

    def scale_actions(self, actions: Tensor) -> np.ndarray:
        """Map actions in [-1, 1] (clamped) affinely onto the Box bounds, as a numpy batch."""
        a = actions.detach().to("cpu", torch.float64).clamp(-1.0, 1.0).numpy()
        a = self._act_low + (a + 1.0) * 0.5 * (self._act_high - self._act_low)
        return a.reshape(self.num_envs, *self._act_shape).astype(self.env.single_action_space.dtype)

    def step(self, actions: Tensor) -> StepResult:
        """Step every env; envs that finished were reset in this same step (SAME_STEP)."""
        obs, reward, terminated, truncated, info = self.env.step(self.scale_actions(actions))
        final = np.array(obs, dtype=np.float32, copy=True)
        mask = info.get("_final_obs")
        if mask is not None:
            for i in np.flatnonzero(mask):
                final[i] = np.asarray(info["final_obs"][i], dtype=np.float32)
        obs_t = self._to_torch(obs)
        final_t = self._to_torch(final)
        reward_t = torch.as_tensor(np.asarray(reward, dtype=np.float32)).to(self.device)
        term_t = torch.as_tensor(np.asarray(terminated, dtype=bool)).to(self.device)
        trunc_t = torch.as_tensor(np.asarray(truncated, dtype=bool)).to(self.device)
        return StepResult(
            obs=obs_t,
            critic_obs=obs_t,
            reward=reward_t,
            terminated=term_t,
            truncated=trunc_t,
            final_obs=final_t,
            final_critic_obs=final_t,
            info={"log": {}},
        )

    def render(self) -> Any:
        """Frames of the sub-environments (``render_mode='rgb_array'``), else None."""
        return self.env.render()

    def close(self) -> None:
        """Close the vector env (and its subprocesses in async mode)."""
        self.env.close()

    def deployment_info(self) -> dict[str, Any]:
        """What is known for a generic gymnasium task; robot fields are unknown."""
        info: dict[str, Any] = {
            "task": self.cfg.task,
            "simulator": "gymnasium",
            "action_low": self._act_low.tolist(),
            "action_high": self._act_high.tolist(),
            "observation_layout": [{"name": "obs", "size": self.obs_dim, "scale": None}],
            "joint_names": None,
            "default_joint_pos": None,
            "kp": None,
            "kd": None,
            "control_dt": None,
        }
        info["unknown"] = [k for k, v in info.items() if v is None]
        return info
