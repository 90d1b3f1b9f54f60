"""Our G1 task's reward/observation terms: closed-form values and documented signs on hand-made
states (standing still under a zero command, falling, feet crossing), plus one check on the sim."""

from __future__ import annotations

import math

import pytest
import torch

from fast_lora_td3.tasks import g1_rewards as r

STAND_SEP = 0.24  # lateral feet separation of the G1 in its default pose (measured in mjlab)


def _quat_about_x(angle: float) -> torch.Tensor:
    return torch.tensor([math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0])


def _gravity_in_frame(q: torch.Tensor) -> torch.Tensor:
    """Brute force: R(q)ᵀ · (0, 0, -1) with R built from the (w, x, y, z) quaternion."""
    w, x, y, z = q.tolist()
    rot = torch.tensor(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )
    return rot.T @ torch.tensor([0.0, 0.0, -1.0])


def test_weights_and_signs_follow_spec() -> None:
    from fast_lora_td3.tasks.g1_velocity import REWARD_WEIGHTS

    assert REWARD_WEIGHTS == {
        "track_linear_velocity": 2.0, "track_angular_velocity": 1.5, "feet_phase": 5.0,
        "alive": 10.0, "ang_vel_xy": -1.0, "orientation": -10.0, "action_rate": -2.0,
        "pose": -0.5, "feet_too_close": -10.0, "foot_orientation": -5.0,
    }  # fmt: skip


def test_gait_phase_observation() -> None:
    t = torch.tensor([0.0, 0.2, 0.4, 0.8, 1.0])
    phase = r.gait_phase_from(t, period_s=0.8)
    torch.testing.assert_close(phase, torch.tensor([0.0, 0.25, 0.5, 0.0, 0.25]))
    obs = r.gait_phase_obs_from(phase)
    torch.testing.assert_close(obs[1], torch.tensor([1.0, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(obs.norm(dim=-1), torch.ones(5))


def test_standing_still_under_zero_command_is_not_penalised() -> None:
    n = 3
    zero_cmd = torch.zeros(n, 3)
    phase = torch.tensor([0.1, 0.3, 0.9])
    feet_down = torch.zeros(n, 2)
    feet_phase = r.feet_phase_reward_from(feet_down, phase, zero_cmd)
    torch.testing.assert_close(feet_phase, torch.ones(n))  # the maximum: both feet stay down
    heading = torch.tensor([0.0, 1.0, -2.0])
    left_axis = torch.stack([-torch.sin(heading), torch.cos(heading)], -1)
    left, right = STAND_SEP / 2 * left_axis, -STAND_SEP / 2 * left_axis
    assert torch.equal(r.feet_too_close_penalty_from(left, right, heading), torch.zeros(n))
    flat = _gravity_in_frame(_quat_about_x(0.0)).expand(n, 2, 3)
    assert torch.equal(r.foot_tilt_penalty_from(flat), torch.zeros(n))
    assert torch.equal(r.squared_norm_from(torch.zeros(n, 29)), torch.zeros(n))
    # Lifting a foot while told to stand lowers the reward.
    lifted = feet_down.clone()
    lifted[:, 0] = 0.05
    torch.testing.assert_close(
        r.feet_phase_reward_from(lifted, phase, zero_cmd), torch.full((n,), math.exp(-1.0))
    )


def test_feet_phase_follows_gait_when_moving() -> None:
    cmd = torch.tensor([[0.5, 0.0, 0.0]])
    quarter = torch.tensor([0.25])  # left foot at the top of its swing arc, right foot in stance
    target = r.desired_feet_height_from(quarter, cmd, swing_height=0.08, command_threshold=0.1)
    torch.testing.assert_close(target, torch.tensor([[0.08, 0.0]]))
    on_target = r.feet_phase_reward_from(target, quarter, cmd, swing_height=0.08, std=0.05)
    both_down = r.feet_phase_reward_from(
        torch.zeros(1, 2), quarter, cmd, swing_height=0.08, std=0.05
    )
    torch.testing.assert_close(on_target, torch.ones(1))
    torch.testing.assert_close(both_down, torch.tensor([math.exp(-(0.08**2) / 0.05**2)]))
    three_quarter = r.desired_feet_height_from(torch.tensor([0.75]), cmd, 0.08, 0.1)
    torch.testing.assert_close(three_quarter, torch.tensor([[0.0, 0.08]]))  # legs alternate


def test_feet_crossing_is_penalised_in_the_heading_frame() -> None:
    for heading in (0.0, 0.7, math.pi / 2, -2.5):
        h = torch.tensor([heading])
        left_axis = torch.tensor([[-math.sin(heading), math.cos(heading)]])
        crossed_left, crossed_right = (
            -0.1 * left_axis,
            0.1 * left_axis,
        )  # left foot 0.1 m to the right
        pen = r.feet_too_close_penalty_from(crossed_left, crossed_right, h, min_separation=0.15)
        torch.testing.assert_close(pen, torch.tensor([0.15 + 0.2]))
        close = r.feet_too_close_penalty_from(0.05 * left_axis, -0.05 * left_axis, h, 0.15)
        torch.testing.assert_close(close, torch.tensor([0.05]))
        assert pen > close > 0


def test_falling_is_penalised() -> None:
    angles = [0.3, math.pi / 2, math.pi]
    g = torch.stack([_gravity_in_frame(_quat_about_x(a)) for a in angles])  # [3, 3]
    feet = torch.stack([g, g], dim=1)  # both feet tilted alike
    expected = torch.tensor([2 * math.sin(a) ** 2 for a in angles])
    torch.testing.assert_close(r.foot_tilt_penalty_from(feet), expected, atol=1e-6, rtol=1e-5)
    tumbling = torch.tensor([[2.0, -1.0, 0.3]])
    torch.testing.assert_close(r.squared_norm_from(tumbling[:, :2]), torch.tensor([5.0]))


def test_quaternion_helper_matches_mjlab() -> None:
    from mjlab.utils.lab_api.math import quat_apply_inverse

    q = _quat_about_x(0.9)
    torch.testing.assert_close(
        quat_apply_inverse(q[None], torch.tensor([[0.0, 0.0, -1.0]]))[0], _gravity_in_frame(q)
    )


@pytest.mark.mjlab
def test_terms_on_the_sim_in_default_pose() -> None:
    from fast_lora_td3.envs import EnvConfig, make_env

    env = make_env(EnvConfig(backend="mjlab", task="FastLoRA-Velocity-Flat-G1", num_envs=2, seed=1))
    try:
        u = env.env
        rm = u.reward_manager
        values = {
            n: rm.get_term_cfg(n).func(u, **rm.get_term_cfg(n).params) for n in rm.active_terms
        }
        for name, v in values.items():
            assert v.shape == (2,) and torch.isfinite(v).all(), name
            assert (v >= 0).all(), name  # every term is ≥ 0: the weight carries the sign
        assert torch.equal(
            values["feet_too_close"], torch.zeros(2)
        )  # default stance is wide enough
        assert values["pose"].max() < 1e-6 and values["foot_orientation"].max() < 1e-3
        assert torch.equal(values["alive"], torch.ones(2))
        for _ in range(3):
            res = env.step(torch.zeros(2, env.action_dim))
            assert torch.isfinite(res.reward).all()
        layout = [t["name"] for t in env.deployment_info()["observation_layout"]]
        assert layout[-1] == "gait_phase" and "base_lin_vel" not in layout
        critic_terms = u.observation_manager.active_terms["critic"]
        assert "base_lin_vel" in critic_terms and env.critic_obs_dim == env.obs_dim + 3
    finally:
        env.close()
