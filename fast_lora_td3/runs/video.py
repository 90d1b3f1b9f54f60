"""Video recording for `play`: deterministic rollout frames written as MP4 (imageio-ffmpeg)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from fast_lora_td3.envs.base import VecEnv
from fast_lora_td3.errors import ConfigError


@torch.no_grad()
def record_video(
    act: Callable[[Tensor], Tensor],
    env: VecEnv,
    path: Path,
    length: int = 200,
    fps: float | None = None,
) -> Path:
    """Roll out `act` from a fresh reset for `length` steps and write the rendered frames to `path`.

    The env must have been built with `env.video=true` (mjlab renders offscreen; on a CPU machine set
    `MUJOCO_GL=egl`, Mesa's EGL, which is slow: about a frame per second on 2 cores).
    """
    import imageio

    render = getattr(env, "render", None)
    if render is None:
        raise ConfigError(f"env.video=true: the {type(env).__name__} backend cannot render frames")
    obs, _ = env.reset()
    frames = []
    for _ in range(length):
        obs = env.step(act(obs).clamp(-1.0, 1.0)).obs
        frame = render()
        if frame is None:
            raise ConfigError(
                "env.video=true but the simulator returned no frame: build the env with "
                "env.video=true (render_mode=rgb_array); on a headless CPU machine set MUJOCO_GL=egl"
            )
        frames.append(frame[0] if frame.ndim == 4 else frame)
    path.parent.mkdir(parents=True, exist_ok=True)
    dt = getattr(env, "step_dt", 0.02)
    imageio.mimsave(path, frames, fps=fps or round(1.0 / dt))
    return path
