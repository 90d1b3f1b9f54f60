"""Isaac Lab adapter against a stand-in env with Isaac Lab's ``ManagerBasedRLEnv`` return types.

The stand-in follows 2.3.2's ``ManagerBasedRLEnv.step`` (checked against the wheel's source by
tests/test_isaaclab_conformance.py): actions → episode_length_buf += 1 → terminations / time-outs
→ reward (written into a reused buffer) → (≥ 3.0: ``extras["final_obs"]`` when
``cfg.compute_final_obs``) → ``_reset_idx(done ids)`` (sets ``extras["log"]``) → command update →
``observation_manager.compute(update_history=True)``; it returns
``(obs_buf, reward_buf, reset_terminated, reset_time_outs, extras)`` and ``extras`` never holds
``"time_outs"`` (only the RL-library wrappers add it).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

from fast_lora_td3.envs import EnvConfig, VecEnv, make_env
from fast_lora_td3.envs.isaaclab_env import IsaacLabVecEnv
from fast_lora_td3.errors import ConfigError

N = 4


def _term(env: object) -> None:  # a plain-function observation term
    return None


class _Filter:  # a class modifier (like isaaclab.utils.modifiers.DigitalFilter): keeps state
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _ObservationManager:
    def __init__(self, env: _StandInEnv) -> None:
        self.env = env
        self.active_terms = {"policy": ["pos", "clock", "pos_sq"]}
        self.group_obs_term_dim = {"policy": [(1,), (1,), (1,)]}
        self._group_obs_term_cfgs = {
            "policy": [
                SimpleNamespace(func=_term, history_length=0, modifiers=None, noise=None)
                for _ in range(3)
            ]
        }
        self.history_updates = 0

    def compute(self, update_history: bool = False) -> dict:
        e = self.env
        self.history_updates += int(update_history)
        policy = torch.stack([e.pos, e.episode_length_buf / 100.0, e.pos**2], dim=-1)
        groups = {"policy": policy}
        if e.with_critic:  # a non-concatenated group: a dict of term tensors
            groups["critic"] = {
                "pos": e.pos[:, None].clone(),
                "clock": e.episode_length_buf[:, None].float(),
            }
        return groups


class _StandInEnv:
    """Mimics isaaclab.envs.ManagerBasedRLEnv (unwrapped)."""

    def __init__(
        self,
        native_final: bool | None,
        finite: bool = False,
        critic: bool = True,
        managers: bool = True,
    ) -> None:
        cfg = SimpleNamespace(is_finite_horizon=finite, seed=None)
        if native_final is not None:  # Isaac Lab ≥ 3.0 has the field; 2.x does not
            cfg.compute_final_obs = native_final
        self.cfg, self.with_critic, self.managers = cfg, critic, managers
        self.num_envs, self.device, self.step_dt = N, "cpu", 0.02
        self.max_episode_length = 5
        self.single_action_space = gym.spaces.Box(-float("inf"), float("inf"), shape=(2,))
        self.episode_length_buf = torch.zeros(N, dtype=torch.long)
        self.pos = torch.zeros(N)
        self.reward_buf = torch.zeros(N)
        self.reset_terminated = torch.zeros(N, dtype=torch.bool)
        self.reset_time_outs = torch.zeros(N, dtype=torch.bool)
        self.extras: dict = {}
        self._om = _ObservationManager(self)
        self.last_actions: torch.Tensor | None = None
        self.reset_calls: list[list[int]] = []
        self.closed = False

    @property
    def observation_manager(self) -> _ObservationManager:
        if not self.managers:  # a direct-workflow env has no observation manager
            raise AttributeError("observation_manager")
        return self._om

    @property
    def unwrapped(self) -> _StandInEnv:
        return self

    def seed(self, seed: int = -1) -> int:
        self.cfg.seed = seed
        return seed

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        self.reset_calls.append(env_ids.tolist())
        self.pos[env_ids] = -0.25 * (env_ids.float() + 1)  # distinct from any terminal state
        self.episode_length_buf[env_ids] = 0
        self.extras["log"] = {"Episode_Termination/time_out": torch.tensor(1.0)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._reset_idx(torch.arange(N))
        return self._om.compute(update_history=True), self.extras

    def step(self, action: torch.Tensor) -> tuple:
        self.last_actions = action.clone()  # extras["log"] lingers until the next reset (as 2.3)
        self.pos += action.mean(-1)
        self.episode_length_buf += 1
        self.reset_terminated[:] = self.pos.abs() > 2.0
        self.reset_time_outs[:] = self.episode_length_buf >= self.max_episode_length
        self.reward_buf[:] = self.pos  # the same buffer, rewritten every step
        done_ids = (self.reset_terminated | self.reset_time_outs).nonzero().squeeze(-1)
        if len(done_ids) > 0:
            if getattr(self.cfg, "compute_final_obs", False):
                self.extras["final_obs"] = self._om.compute()
            self._reset_idx(done_ids)
        self.obs_buf = self._om.compute(update_history=True)
        return (
            self.obs_buf,
            self.reward_buf,
            self.reset_terminated,
            self.reset_time_outs,
            self.extras,
        )

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class _App:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _make(native_final: bool | None, **cfg_kw) -> tuple[IsaacLabVecEnv, _StandInEnv, _App]:
    flags = {k: cfg_kw.pop(k) for k in ("finite", "critic", "managers") if k in cfg_kw}
    stand_in, app = _StandInEnv(native_final, **flags), _App()
    cfg = EnvConfig(
        backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N, seed=9, **cfg_kw
    )
    return IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app)), stand_in, app


@pytest.mark.parametrize(
    "native_final", [True, None], ids=["isaaclab3-final_obs", "isaaclab2-hook"]
)
def test_final_obs_is_pre_reset_observation(native_final: bool | None) -> None:
    env, s, app = _make(native_final)
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
    env, s, _ = _make(True)
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
        env, _, _ = _make(False, critic=False, managers=False)
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
        ("modifiers", [SimpleNamespace(func=_Filter())], "stateful modifier _Filter"),
        ("func", _Filter(), "class-based term _Filter"),
    ],
    ids=["history", "stateful-modifier", "class-term"],
)
def test_pre_reset_hook_refused_loudly(blocker: tuple, caplog: pytest.LogCaptureFixture) -> None:
    attr, value, message = blocker
    stand_in, app = _StandInEnv(None), _App()
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
    env, s, _ = _make(None, finite=True, action_clip=0.5)
    r = env.step(torch.tensor([[3.0, -3.0]] * N))
    assert s.last_actions.abs().max() == 0.5
    for _ in range(4):
        r = env.step(torch.zeros(N, 2))
    assert r.terminated.all() and not r.truncated.any()
    env.close()


def test_randomized_episode_start() -> None:
    env, s, _ = _make(True, randomize_episode_start=True)
    assert s.episode_length_buf.min() >= 0 and s.episode_length_buf.max() < 5
    assert s.episode_length_buf.dtype == torch.long
    env.close()


def test_setup_error_closes_env_not_app() -> None:
    stand_in, app = _StandInEnv(True), _App()
    stand_in._om.compute = lambda update_history=False: {"obs": torch.zeros(N, 3)}
    cfg = EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=N)
    with pytest.raises(ConfigError, match="'policy' observation group"):
        IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, app))
    assert app.closed == 0 and stand_in.closed


def test_deployment_info_reads_managers() -> None:
    env, _, _ = _make(True)
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


class _ResetsElsewhere(_StandInEnv):
    """An Isaac Lab whose step() no longer resets through _reset_idx (the hook never fires)."""

    def step(self, action: torch.Tensor) -> tuple:
        reset_idx, self._reset_idx = self._reset_idx, self._reset_envs
        try:
            return super().step(action)
        finally:
            self._reset_idx = reset_idx

    def _reset_envs(self, env_ids: torch.Tensor) -> None:
        _StandInEnv._reset_idx(self, env_ids)


@pytest.mark.parametrize("native_final", [None, True], ids=["2.3-hook", "3.0-no-key"])
def test_missing_final_obs_at_run_time_falls_back_loudly(
    native_final: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    stand_in = _ResetsElsewhere(native_final)
    if native_final:
        stand_in.cfg.compute_final_obs = False  # the env never writes extras["final_obs"] ...
    app = _App()
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
