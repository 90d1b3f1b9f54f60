"""scripts/isaaclab_smoke.py against the stand-in env: it passes a correct adapter and fails
(exit 1) when final observations are missing or taken after the reset."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import load_script
from isaaclab_stand_in import StandInApp, StandInEnv

import fast_lora_td3.envs as envs
from fast_lora_td3.envs import EnvConfig
from fast_lora_td3.envs.isaaclab_env import IsaacLabVecEnv

smoke = load_script("isaaclab_smoke")

# The stand-in's policy column 1 is episode_length_buf / 100 (time limit: 5 steps).
CLOCK = smoke.ClockCheck(slice(1, 2), None, torch.tensor([0.05]), torch.tensor([0.0]))


class _LateFinalObs(StandInEnv):
    """A broken Isaac Lab ≥ 3.0: extras["final_obs"] computed after the reset."""

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        super()._reset_idx(env_ids)
        if getattr(self.cfg, "compute_final_obs", False):
            self.extras["final_obs"] = self._om.compute()


def _env(stand_in: StandInEnv) -> IsaacLabVecEnv:
    cfg = EnvConfig(backend="isaaclab", task="Isaac-Velocity-Flat-G1-v0", num_envs=4, seed=0)
    return IsaacLabVecEnv(cfg, make_gym_env=lambda c: (stand_in, StandInApp()))


@pytest.mark.parametrize("native_final", [True, None], ids=["3.0-final_obs", "2.3-hook"])
def test_smoke_checks_pass_on_a_correct_adapter(native_final: bool | None) -> None:
    counts = smoke.check_run(_env(StandInEnv(native_final)), 12, CLOCK)
    assert counts["steps"] == 12 and counts["truncated"] > 0


def test_smoke_checks_catch_a_post_reset_final_obs() -> None:
    with pytest.raises(AssertionError, match="not the pre-reset one"):
        smoke.check_run(_env(_LateFinalObs(True)), 12, CLOCK)


def test_smoke_checks_catch_a_missing_final_obs_path() -> None:
    stand_in = StandInEnv(None)
    stand_in._om._group_obs_term_cfgs["policy"][0].history_length = 2  # hook refused
    with pytest.raises(AssertionError, match="no exact final-observation path"):
        smoke.check_run(_env(stand_in), 12, CLOCK)


def test_fastlora_clock_is_the_gait_phase() -> None:
    clock = smoke.fastlora_clock(max_episode_length=50, step_dt=0.02)  # 1 s, period 0.8 s
    assert torch.allclose(clock.at_reset, torch.tensor([0.0, 1.0]))
    assert torch.allclose(clock.at_time_limit, torch.tensor([1.0, 0.0]), atol=1e-5)  # φ = 0.25


@pytest.mark.parametrize("broken", [False, True], ids=["ok", "hook-refused"])
def test_main_exit_code(broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = StandInEnv(None)
    if broken:
        stand_in._om._group_obs_term_cfgs["policy"][0].history_length = 2
    monkeypatch.setattr(envs, "make_env", lambda cfg: _env(stand_in))
    code = smoke.main(["--task", "Isaac-Velocity-Flat-G1-v0", "--steps", "12", "--device", "cpu"])
    assert code == (1 if broken else 0)
