"""mjlab backend: protocol shapes, true final observations on time-outs, and the collector's
episode stats over it (CPU)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from fast_lora_td3.envs import EnvConfig, StepResult, VecEnv, make_env, mjlab_env
from fast_lora_td3.errors import ConfigError

pytestmark = pytest.mark.mjlab

CARTPOLE = "Mjlab-Cartpole-Swingup"
G1_STOCK = "Mjlab-Velocity-Flat-Unitree-G1"
G1_OURS = "FastLoRA-Velocity-Flat-G1"


def _make(task: str, num_envs: int, episode_length_s: float) -> VecEnv:
    cfg = EnvConfig(backend="mjlab", task=task, num_envs=num_envs, seed=3, device="cpu")
    cfg.episode_length_s = episode_length_s
    return make_env(cfg)


@pytest.fixture(scope="module")
def cartpole() -> VecEnv:
    # dt = 0.05 s, so 0.2 s episodes time out every 4 steps.
    env = _make(CARTPOLE, 4, 0.2)
    yield env
    env.close()


@pytest.fixture(scope="module", params=[G1_STOCK, G1_OURS])
def g1(request: pytest.FixtureRequest) -> VecEnv:
    # dt = 0.02 s, so 0.2 s episodes time out after 10 steps (or terminate earlier on a fall).
    env = _make(request.param, 2, 0.2)
    yield env
    env.close()


def _check_step(env: VecEnv, r: StepResult) -> None:
    n = env.num_envs
    assert r.obs.shape == (n, env.obs_dim) and r.final_obs.shape == (n, env.obs_dim)
    assert r.critic_obs.shape == (n, env.critic_obs_dim)
    assert r.final_critic_obs.shape == (n, env.critic_obs_dim)
    assert r.reward.shape == (n,) and r.terminated.shape == (n,) and r.truncated.shape == (n,)
    for t in (r.obs, r.critic_obs, r.final_obs, r.final_critic_obs, r.reward):
        assert t.dtype == torch.float32 and t.device == env.device
        assert torch.isfinite(t).all()
    assert r.terminated.dtype == torch.bool and r.truncated.dtype == torch.bool
    not_done = ~(r.terminated | r.truncated)
    assert torch.equal(r.final_obs[not_done], r.obs[not_done])
    assert torch.equal(r.final_critic_obs[not_done], r.critic_obs[not_done])


def _term_slice(env: VecEnv, group: str, term: str) -> slice:
    om = env.env.observation_manager
    start = 0
    for name, dim in zip(om.active_terms[group], om.group_obs_term_dim[group], strict=True):
        size = math.prod(dim)
        if name == term:
            return slice(start, start + size)
        start += size
    raise KeyError(term)


class _ResetSpy:
    """Records the entity's joint state right before and after each partial reset."""

    def __init__(self, env: VecEnv, entity: str) -> None:
        self.inner = env.env
        self.entity = env.env.scene[entity]
        self.original = self.inner.reset
        self.calls: list[dict[str, torch.Tensor]] = []

    def __call__(self, **kwargs):
        d = self.entity.data
        pre = {"pos": d.joint_pos.clone(), "vel": d.joint_vel.clone()}
        out = self.original(**kwargs)
        self.calls.append(
            {
                **{f"pre_{k}": v for k, v in pre.items()},
                "post_pos": d.joint_pos.clone(),
                "post_vel": d.joint_vel.clone(),
                "env_ids": kwargs.get("env_ids"),
            }
        )
        return out

    def __enter__(self) -> _ResetSpy:
        self.inner.reset = self
        return self

    def __exit__(self, *exc: object) -> None:
        del self.inner.reset  # restore the class method


def _cartpole_obs(pos: torch.Tensor, vel: torch.Tensor) -> torch.Tensor:
    """Cartpole actor obs from the raw joint state: cart pos, cos/sin pole angle, velocities."""
    return torch.stack(
        [pos[:, 0], torch.cos(pos[:, 1]), torch.sin(pos[:, 1]), vel[:, 0], vel[:, 1]], -1
    )


def test_cartpole_protocol_20_steps(cartpole: VecEnv) -> None:
    assert isinstance(cartpole, VecEnv)
    assert (cartpole.obs_dim, cartpole.action_dim, cartpole.max_episode_length) == (5, 1, 4)
    assert cartpole.has_critic_obs and cartpole.device == torch.device("cpu")
    obs, critic = cartpole.reset(seed=1)
    assert obs.shape == (4, 5) and critic.shape == (4, 5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        _check_step(cartpole, cartpole.step(torch.rand(4, 1, generator=gen) * 2 - 1))


def test_cartpole_final_obs_is_pre_reset_state(cartpole: VecEnv) -> None:
    cartpole.reset(seed=2)
    gen = torch.Generator().manual_seed(1)
    with _ResetSpy(cartpole, "cartpole") as spy:
        for step in range(1, 9):
            r = cartpole.step(torch.rand(4, 1, generator=gen) * 2 - 1)
            if step % 4:
                assert not r.truncated.any() and not spy.calls
                continue
            assert r.truncated.all() and not r.terminated.any()
            call = spy.calls.pop()
            assert call["env_ids"].tolist() == [0, 1, 2, 3]
            expected_final = _cartpole_obs(call["pre_pos"], call["pre_vel"])
            expected_next = _cartpole_obs(call["post_pos"], call["post_vel"])
            torch.testing.assert_close(r.final_obs, expected_final)
            torch.testing.assert_close(r.final_critic_obs, expected_final)
            torch.testing.assert_close(r.obs, expected_next)
            # Swing-up starts hanging down (angle ≈ π): after 4 random pushes the state has moved.
            assert (r.final_obs - r.obs).abs().amax(dim=-1).gt(1e-4).all()
            assert "Episode_Termination/time_out" in r.info["log"]


def test_collector_episode_stats_match_brute_force(cartpole: VecEnv, make_collector) -> None:
    collector = make_collector(cartpole, seed=4)  # resets the envs with seed 4
    assert collector.episode_tracker.pop() is None
    running = torch.zeros(4, dtype=torch.float64)
    finished: list[float] = []
    for _ in range(10):
        r = collector.step()
        running += r.reward.double()
        done = r.terminated | r.truncated
        finished += running[done].tolist()
        running[done] = 0.0
    stats = collector.episode_tracker.pop()
    assert stats is not None and int(stats["count"]) == len(finished) == 8
    assert stats["mean_return"].item() == pytest.approx(sum(finished) / len(finished), rel=1e-5)
    assert stats["mean_length"].item() == pytest.approx(4.0)
    assert collector.episode_tracker.pop() is None  # cleared by the previous pop


def test_randomized_episode_start(cartpole: VecEnv) -> None:
    cartpole.cfg.randomize_episode_start = True
    try:
        cartpole.reset(seed=5)
        buf = cartpole.env.episode_length_buf
        assert buf.min() >= 0 and buf.max() < cartpole.max_episode_length
    finally:
        cartpole.cfg.randomize_episode_start = False
        cartpole.reset(seed=5)
    assert cartpole.env.episode_length_buf.eq(0).all()


def test_g1_protocol_and_final_obs(g1: VecEnv) -> None:
    assert g1.action_dim == 29 and g1.has_critic_obs and g1.max_episode_length == 10
    g1.reset(seed=6)
    joint = _term_slice(g1, "critic", "joint_pos")
    default = g1.env.scene["robot"].data.default_joint_pos
    gen = torch.Generator().manual_seed(3)
    seen_done = False
    with _ResetSpy(g1, "robot") as spy:
        for _ in range(20):
            r = g1.step(torch.rand(2, 29, generator=gen) * 2 - 1)
            _check_step(g1, r)
            done = r.terminated | r.truncated
            if not done.any():
                assert not spy.calls
                continue
            seen_done = True
            call = spy.calls.pop()
            ids = call["env_ids"]
            assert torch.equal(ids, done.nonzero().squeeze(-1))
            # The critic's joint_pos term is the unbiased joint_pos - default: compare to raw state.
            torch.testing.assert_close(
                r.final_critic_obs[ids, joint], (call["pre_pos"] - default)[ids]
            )
            torch.testing.assert_close(r.critic_obs[ids, joint], (call["post_pos"] - default)[ids])
            assert (r.final_critic_obs[ids] - r.critic_obs[ids]).abs().amax(-1).gt(1e-3).all()
    assert seen_done


def test_g1_deployment_info(g1: VecEnv) -> None:
    info = g1.deployment_info()
    assert len(info["joint_names"]) == 29 and len(info["default_joint_pos"]) == 29
    assert len(info["kp"]) == 29 and min(info["kp"]) > 0 and min(info["kd"]) > 0
    assert info["control_dt"] == pytest.approx(0.02) and info["action_offset_is_default_pos"]
    sizes = sum(t["size"] for t in info["observation_layout"])
    assert sizes == g1.obs_dim and info["unknown"] == []


def test_unknown_mjlab_task_lists_close_matches() -> None:
    with pytest.raises(ConfigError, match="Mjlab-Cartpole-Swingup") as exc:
        make_env(EnvConfig(backend="mjlab", task="Mjlab-Cartpole-Swingupp", num_envs=2))
    assert "\n" not in str(exc.value)


def test_manager_tables_print_once_per_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A training env and an eval env: mjlab's environment and manager tables appear once."""
    monkeypatch.setattr(mjlab_env, "_TABLES_PRINTED", False)  # as in a fresh process
    capsys.readouterr()
    for num_envs in (3, 2):
        _make(CARTPOLE, num_envs, 0.2).close()
    out = capsys.readouterr().out
    assert out.count("Base Environment") == 1, out
    assert out.count("[INFO] <ActionManager>") == 1, out


def test_importing_mjlab_shows_no_torch_jit_notice() -> None:
    """mjlab `torch.jit.script`s its math helpers at import; torch's notice is not the user's."""
    code = "from fast_lora_td3.envs.mjlab_env import mjlab_task_ids; mjlab_task_ids()"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert "torch.jit" not in res.stderr, res.stderr
