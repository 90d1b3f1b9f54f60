"""Isaac Lab adapter against a stand-in env with Isaac Lab's ``ManagerBasedRLEnv`` return types
(tests/isaaclab_stand_in.py)."""

from __future__ import annotations

import importlib.util
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
from isaaclab_stand_in import N, StandInApp, StandInEnv, StatefulFilter, make_isaaclab_env

from fast_lora_td3.envs import EnvConfig, VecEnv, make_env
from fast_lora_td3.envs.isaaclab_env import IsaacLabVecEnv
from fast_lora_td3.errors import ConfigError


@pytest.mark.parametrize(
    "native_final", [True, None], ids=["isaaclab3-final_obs", "isaaclab2-hook"]
)
def test_final_obs_is_pre_reset_observation(native_final: bool | None) -> None:
    env, s, app = make_isaaclab_env(native_final)
    assert isinstance(env, VecEnv)
    assert (env.obs_dim, env.critic_obs_dim, env.action_dim, env.max_episode_length) == (3, 2, 2, 5)
    assert env.has_critic_obs and s.cfg.seed == 9
    actions = torch.tensor([[0.1, 0.1], [0.0, 0.0], [-0.2, -0.2], [1.0, 1.0]])
    for step in range(1, 7):
        expected_pos = s.pos + actions.mean(-1)  # the terminal state the env will reach
        expected_clock = s.episode_length_buf + 1
        r = env.step(actions)
        done = r.terminated | r.truncated
        assert r.info["final_obs_exact"]
        torch.testing.assert_close(r.final_obs[:, 0], expected_pos)
        torch.testing.assert_close(r.final_obs[:, 1], expected_clock / 100.0)
        torch.testing.assert_close(
            r.final_critic_obs, torch.stack([expected_pos, expected_clock.float()], -1)
        )
        torch.testing.assert_close(r.obs[~done], r.final_obs[~done])
        reset_pos = -0.25 * (torch.arange(N).float() + 1)
        torch.testing.assert_close(r.obs[done, 0], reset_pos[done])
        assert (r.obs[done, 1] == 0).all()
        if step == 4:  # env 3 (reset at -1.0, +1.0 per step) passes |pos| > 2: early termination
            assert r.terminated.tolist() == [False, False, False, True] and not r.truncated.any()
            assert "Episode_Termination/time_out" in r.info["log"]
        if step == 5:  # envs 0-2 time out together; env 3 is mid-episode
            assert r.truncated.tolist() == [True, True, True, False]
        if not done.any():  # 2.3 leaves the last reset's extras["log"] in place: not this step's
            assert r.info["log"] == {}
        reward_copy = r.reward.clone()
        s.reward_buf.fill_(123.0)  # Isaac Lab overwrites its buffers in place next step
        assert torch.equal(r.reward, reward_copy)
    assert s.reset_calls[0] == [0, 1, 2, 3]  # the initial full reset is not an episode end
    assert s._om.history_updates == 7  # reset + 6 steps: the final-obs computation never appends
    env.close()
    assert s.closed and app.closed == 0  # the Kit app outlives the env (finish_simulation_app)
    env.close()
    assert app.closed == 0


def test_lingering_final_obs_key_is_masked() -> None:
    env, s, _ = make_isaaclab_env(True)
    s.extras["final_obs"] = {
        "policy": torch.full((N, 3), 99.0),
        "critic": {"a": torch.full((N, 2), 99.0)},
    }
    r = env.step(torch.zeros(N, 2))  # nobody is done: the stale key must not leak in
    assert torch.equal(r.final_obs, r.obs) and (r.final_obs != 99.0).all()
    env.close()


def test_no_final_obs_path_treats_time_outs_as_terminations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        env, _, _ = make_isaaclab_env(False, critic=False, managers=False)
        for _ in range(5):
            r = env.step(torch.zeros(N, 2))
    assert not r.info["final_obs_exact"] and not env.has_critic_obs
    assert r.terminated.all() and not r.truncated.any()  # never bootstrap from a reset obs
    assert sum("no exact final observation" in m for m in caplog.messages) == 1
    env.close()


@pytest.mark.parametrize(
    "blocker",
    [
        ("history_length", 3, "history_length=3"),
        ("modifiers", [SimpleNamespace(func=StatefulFilter())], "stateful modifier StatefulFilter"),
        ("func", StatefulFilter(), "class-based term StatefulFilter"),
    ],
    ids=["history", "stateful-modifier", "class-term"],
)
def test_pre_reset_hook_refused_loudly(blocker: tuple, caplog: pytest.LogCaptureFixture) -> None:
    attr, value, message = blocker
    stand_in, app = StandInEnv(None), StandInApp()
    setattr(stand_in._om._group_obs_term_cfgs["policy"][1], attr, value)
    cfg = EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N, seed=1)
    with caplog.at_level(logging.ERROR):
        env = IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app))
    assert "_reset_idx" not in vars(stand_in)  # the hook was not installed
    assert env.final_obs_blockers == [
        f"policy/clock: {message}" + (" (stale history)" if attr == "history_length" else "")
    ]
    assert any(
        "policy/clock" in m and "time-outs are treated as terminations" in m
        for m in caplog.messages
    )
    for _ in range(5):
        r = env.step(torch.zeros(N, 2))
    assert r.terminated.all() and not r.truncated.any() and not r.info["final_obs_exact"]
    env.close()


def test_actions_clamped_and_finite_horizon_time_outs_terminate() -> None:
    env, s, _ = make_isaaclab_env(None, finite=True, action_clip=0.5)
    r = env.step(torch.tensor([[3.0, -3.0]] * N))
    assert s.last_actions.abs().max() == 0.5
    for _ in range(4):
        r = env.step(torch.zeros(N, 2))
    assert r.terminated.all() and not r.truncated.any()
    env.close()


def test_randomized_episode_start() -> None:
    env, s, _ = make_isaaclab_env(True, randomize_episode_start=True)
    assert s.episode_length_buf.min() >= 0 and s.episode_length_buf.max() < 5
    assert s.episode_length_buf.dtype == torch.long
    env.close()


def test_setup_error_closes_env_not_app() -> None:
    stand_in, app = StandInEnv(True), StandInApp()
    stand_in._om.compute = lambda update_history=False: {"obs": torch.zeros(N, 3)}
    cfg = EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N)
    with pytest.raises(ConfigError, match="'policy' observation group"):
        IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app))
    assert app.closed == 0 and stand_in.closed


def test_deployment_info_reads_managers() -> None:
    env, _, _ = make_isaaclab_env(True)
    info = env.deployment_info()
    assert [t["name"] for t in info["observation_layout"]] == ["pos", "clock", "pos_sq"]
    assert info["control_dt"] == 0.02 and "joint_names" in info["unknown"]
    env.close()


@pytest.mark.skipif(
    importlib.util.find_spec("isaaclab") is not None, reason="isaaclab is installed"
)
def test_missing_isaaclab_names_install_command() -> None:
    with pytest.raises(ConfigError, match='pip install "isaaclab'):
        make_env(EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=2))


def test_modules_import_without_isaaclab() -> None:
    import fast_lora_td3.envs.isaaclab_env
    import fast_lora_td3.tasks.isaaclab_g1 as g1

    assert fast_lora_td3.envs.isaaclab_env.IsaacLabVecEnv is IsaacLabVecEnv
    assert not [m for m in sys.modules if m.split(".")[0] in ("isaaclab", "isaacsim", "omni")]
    with pytest.raises(AttributeError):
        g1.NotAConfig  # noqa: B018  (unknown names still raise; the configs build lazily)


class _ResetsElsewhere(StandInEnv):
    """An Isaac Lab whose step() no longer resets through _reset_idx (the hook never fires)."""

    def step(self, action: torch.Tensor) -> tuple:
        reset_idx, self._reset_idx = self._reset_idx, self._reset_envs
        try:
            return super().step(action)
        finally:
            self._reset_idx = reset_idx

    def _reset_envs(self, env_ids: torch.Tensor) -> None:
        StandInEnv._reset_idx(self, env_ids)


@pytest.mark.parametrize("native_final", [None, True], ids=["2.3-hook", "3.0-no-key"])
def test_missing_final_obs_at_run_time_falls_back_loudly(
    native_final: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    stand_in = _ResetsElsewhere(native_final)
    if native_final:
        stand_in.cfg.compute_final_obs = False  # the env never writes extras["final_obs"] ...
    app = StandInApp()
    cfg = EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N, seed=1)
    env = IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app))
    if native_final:
        env._native_final = env._exact = True  # ... although the adapter expects it
    with caplog.at_level(logging.ERROR):
        results = [env.step(torch.zeros(N, 2)) for _ in range(6)]
    timed_out = results[4]  # step 5: every env reaches the time limit
    assert timed_out.terminated.all() and not timed_out.truncated.any()
    assert not timed_out.info["final_obs_exact"] and not results[5].info["final_obs_exact"]
    assert results[3].info["final_obs_exact"]  # nothing ended before: nothing to doubt
    assert sum("without a final observation" in m for m in caplog.messages) == 1
    env.close()
