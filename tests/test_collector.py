"""The collector keeps the training-episode statistics (the backends are pure adapters): against a
brute-force count, with evaluation rows left out, and across a checkpoint round trip."""

from __future__ import annotations

import copy

import pytest
import torch
from isaaclab_stand_in import N, make_isaaclab_env

from fast_lora_td3.envs import EnvConfig, make_env
from fast_lora_td3.training.evaluation import SliceEvaluation


def _point_mass(num_envs: int = 8, seed: int = 3) -> object:
    # 0.4 s at 50 Hz: a 20-step time limit.
    cfg = EnvConfig(backend="dummy", task="PointMassAsym-v0", num_envs=num_envs, seed=seed)
    cfg.episode_length_s = 0.4
    return make_env(cfg)


def _brute_force(results: list, rows: slice) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes that ended, counted one env at a time in float64."""
    returns, lengths = [], []
    first = results[0].reward[rows]
    running, steps = [0.0] * len(first), [0] * len(first)
    for r in results:
        reward, done = r.reward[rows].tolist(), (r.terminated | r.truncated)[rows].tolist()
        for i, (rew, d) in enumerate(zip(reward, done, strict=True)):
            running[i] += rew
            steps[i] += 1
            if d:
                returns.append(running[i])
                lengths.append(steps[i])
                running[i], steps[i] = 0.0, 0
    return returns, lengths


def test_backends_keep_no_episode_statistics() -> None:
    env, _, _ = make_isaaclab_env(True)
    for backend in (_point_mass(), env):
        assert not hasattr(backend, "episode_tracker")
        r = backend.step(torch.zeros(backend.num_envs, backend.action_dim))
        assert "episode" not in r.info
    env.close()


def test_episode_stats_match_brute_force(make_collector) -> None:
    collector = make_collector(_point_mass(), seed=3)
    assert collector.episode_tracker.pop() is None
    results = [collector.step() for _ in range(70)]
    returns, lengths = _brute_force(results, slice(None))
    assert len(returns) >= 16  # every env timed out at least twice
    stats = collector.episode_tracker.pop()
    assert stats is not None and int(stats["count"]) == len(returns)
    assert stats["mean_return"].item() == pytest.approx(sum(returns) / len(returns), rel=1e-5)
    assert stats["mean_length"].item() == pytest.approx(sum(lengths) / len(lengths), rel=1e-6)
    assert stats["mean_return"].dtype == torch.float32
    assert collector.episode_tracker.pop() is None  # cleared by the previous pop


def test_eval_slice_rows_stay_out_of_training_statistics(make_collector) -> None:
    env, _, _ = make_isaaclab_env(True)
    collector = make_collector(env, seed=1)
    collector.eval_slice = SliceEvaluation(env, 2)
    assert collector.episode_tracker.returns.shape == (N - 2,)
    results = [collector.step() for _ in range(12)]
    train_returns, _ = _brute_force(results, slice(2, None))
    eval_returns, _ = _brute_force(results, slice(0, 2))
    stats = collector.episode_tracker.pop()
    assert stats is not None and int(stats["count"]) == len(train_returns)
    expected = sum(train_returns) / len(train_returns)
    assert stats["mean_return"].item() == pytest.approx(expected, rel=1e-5)
    evaluated = collector.eval_slice.pop()
    assert evaluated["eval_return"] == pytest.approx(sum(eval_returns) / len(eval_returns))
    env.close()


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "env-held-tracker"])
def test_running_episodes_survive_a_checkpoint(make_collector, legacy: bool) -> None:
    collector = make_collector(_point_mass(), seed=3)
    for _ in range(30):  # mid-episode: the running returns are not zero
        collector.step()
    assert collector.episode_tracker.returns.abs().sum() > 0
    state = copy.deepcopy(collector.state_dict())
    learner_state = copy.deepcopy(collector.learner.state_dict())
    rng = torch.get_rng_state()
    if legacy:  # checkpoints written while the dummy env kept the running episodes itself
        state["env"]["tracker"] = state.pop("episodes")
    collector.episode_tracker.pop()  # a resumed run starts with no finished episodes
    straight = [collector.step() for _ in range(25)]
    resumed = make_collector(_point_mass(), seed=3)
    resumed.learner.load_state_dict(learner_state)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    for a in straight:
        assert torch.equal(a.reward, resumed.step().reward)
    stats_a, stats_b = collector.episode_tracker.pop(), resumed.episode_tracker.pop()
    assert stats_a is not None and stats_b is not None
    assert all(torch.equal(stats_a[k], stats_b[k]) for k in stats_a)
