"""gymnasium backend (Pendulum-v1), EpisodeTracker, and make_env's one-line config errors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fast_lora_td3.envs import EnvConfig, EpisodeTracker, VecEnv, make_env
from fast_lora_td3.errors import ConfigError


@pytest.fixture(scope="module")
def pendulum() -> VecEnv:
    env = make_env(EnvConfig(backend="gymnasium", task="Pendulum-v1", num_envs=4, seed=7))
    yield env
    env.close()


def test_pendulum_shapes_and_action_scaling(pendulum: VecEnv) -> None:
    assert isinstance(pendulum, VecEnv)
    assert (pendulum.obs_dim, pendulum.action_dim, pendulum.max_episode_length) == (3, 1, 200)
    assert not pendulum.has_critic_obs
    a = torch.tensor([[-1.0], [1.0], [0.0], [5.0]])
    np.testing.assert_allclose(pendulum.scale_actions(a)[:, 0], [-2.0, 2.0, 0.0, 2.0])
    obs, critic = pendulum.reset(seed=7)
    assert obs.shape == (4, 3) and obs.dtype == torch.float32 and torch.equal(obs, critic)
    r = pendulum.step(torch.zeros(4, 1))
    assert r.reward.shape == (4,) and r.reward.dtype == torch.float32
    assert r.terminated.dtype == torch.bool and not (r.terminated | r.truncated).any()
    assert torch.equal(r.final_obs, r.obs)


def test_pendulum_final_obs_on_truncation_matches_twin_envs(pendulum: VecEnv) -> None:
    seed = 11
    pendulum.reset(seed=seed)
    twins = [gym.make("Pendulum-v1") for _ in range(4)]
    for i, t in enumerate(twins):
        t.reset(seed=seed + i)  # make_vec seeds sub-env i with seed + i
    gen = torch.Generator().manual_seed(0)
    tracker = EpisodeTracker(4, "cpu")  # as the collector counts the episodes of these results
    for step in range(1, 201):
        actions = torch.rand(4, 1, generator=gen) * 2 - 1
        scaled = pendulum.scale_actions(actions)
        r = pendulum.step(actions)
        tracker.update(r.reward, r.terminated | r.truncated)
        twin_out = [t.step(scaled[i]) for i, t in enumerate(twins)]
        if step < 200:
            assert not r.truncated.any()
            continue
        assert r.truncated.all() and not r.terminated.any()
        twin_final = np.stack([o[0] for o in twin_out]).astype(np.float32)
        assert all(o[3] for o in twin_out)  # the twins time out on the same step
        np.testing.assert_allclose(r.final_obs.numpy(), twin_final, rtol=1e-6, atol=1e-6)
        twin_next = np.stack([t.reset()[0] for t in twins]).astype(np.float32)
        np.testing.assert_allclose(r.obs.numpy(), twin_next, rtol=1e-6, atol=1e-6)
        assert not np.allclose(r.final_obs.numpy(), r.obs.numpy())
    stats = tracker.pop()
    assert stats is not None and int(stats["count"]) == 4 and stats["mean_length"].item() == 200.0
    for t in twins:
        t.close()


def test_episode_tracker_matches_brute_force() -> None:
    gen = torch.Generator().manual_seed(5)
    n, steps = 6, 50
    rewards = torch.randn(steps, n, generator=gen)
    dones = torch.rand(steps, n, generator=gen) < 0.15
    tracker = EpisodeTracker(n, "cpu")
    ret, length, finished = [0.0] * n, [0] * n, []
    for t in range(steps):
        out = tracker.update(rewards[t], dones[t])
        for i in range(n):
            ret[i] += float(rewards[t, i])
            length[i] += 1
            if dones[t, i]:
                assert out["return"][i].item() == pytest.approx(ret[i], abs=1e-5)
                assert out["length"][i].item() == length[i]
                finished.append((ret[i], length[i]))
                ret[i], length[i] = 0.0, 0
    stats = tracker.pop()
    assert stats is not None and int(stats["count"]) == len(finished)
    assert stats["mean_return"].item() == pytest.approx(np.mean([f[0] for f in finished]), abs=1e-5)
    assert stats["mean_length"].item() == pytest.approx(np.mean([f[1] for f in finished]))
    assert tracker.pop() is None


def _one_line_error(cfg: EnvConfig | dict, match: str) -> str:
    """`cfg`: a config for make_env, or EnvConfig's kwargs (errors the config itself raises)."""
    with pytest.raises(ConfigError, match=match) as exc:
        make_env(EnvConfig(**cfg) if isinstance(cfg, dict) else cfg)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_config_errors() -> None:
    msg = _one_line_error({"backend": "bullet"}, "env.backend")
    assert "mjlab" in msg and "gymnasium" in msg and "isaaclab" in msg
    _one_line_error({"backend": "gymnasium", "task": "Pendulum-v1", "num_envs": 0}, "env.num_envs")
    _one_line_error({"backend": "gymnasium", "task": "Pendulum-v1", "num_envs": -3}, "env.num_envs")
    msg = _one_line_error(
        EnvConfig(backend="gymnasium", task="Pendulum-v9", num_envs=2), "env.task"
    )
    assert "Pendulum-v1" in msg
    _one_line_error(EnvConfig(backend="gymnasium", task="CartPole-v1", num_envs=2), "Box action")
    _one_line_error(
        {"backend": "gymnasium", "task": "Pendulum-v1", "gym_vectorization_mode": "ray"},
        "gym_vectorization_mode",
    )
    _one_line_error({"backend": "gymnasium", "task": "Pendulum-v1", "device": "tpu"}, "env.device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_but_absent() -> None:
    _one_line_error(EnvConfig(backend="gymnasium", task="Pendulum-v1", device="cuda"), "CUDA")


def test_missing_backend_package_names_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mjlab" else real(name, *a)
    )
    _one_line_error(EnvConfig(backend="mjlab", task="Mjlab-Cartpole-Swingup"), "pip install mjlab")
