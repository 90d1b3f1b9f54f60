"""ReplayBuffer against a brute-force reference that keeps the full explicit episode history."""

from __future__ import annotations

import random

import pytest
import torch

from fast_lora_td3.algos.config import AlgoConfig
from fast_lora_td3.config.validate import check_batch_divides
from fast_lora_td3.envs.config import EnvConfig
from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.replay.buffer import ReplayBuffer


class EpisodeSim:
    """Random vectorised episodes (mixed terminations / truncations, lengths from 1) with history."""

    def __init__(self, num_envs, obs_dim, act_dim, critic_dim, seed, max_len=6, p_term=0.15):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.n, self.od, self.ad, self.cd = num_envs, obs_dim, act_dim, critic_dim
        self.max_len, self.p_term = max_len, p_term
        self.limit = [self.rng.randint(1, max_len) for _ in range(num_envs)]
        self.length = [0] * num_envs
        self.cur_obs, self.cur_crit = self._fresh(), self._fresh(critic_dim)
        self.hist = [
            dict(obs=[], crit=[], act=[], rew=[], term=[], trunc=[], fin=[], fcrit=[])
            for _ in range(num_envs)
        ]

    def _fresh(self, dim=None):
        return torch.randn(self.n, dim if dim is not None else self.od, generator=self.gen) * 3

    def step(self, buf: ReplayBuffer) -> None:
        act = torch.rand(self.n, self.ad, generator=self.gen) * 2 - 1
        rew = torch.randn(self.n, generator=self.gen)
        term, trunc = torch.zeros(self.n, dtype=torch.bool), torch.zeros(self.n, dtype=torch.bool)
        for e in range(self.n):
            self.length[e] += 1
            term[e] = self.rng.random() < self.p_term
            trunc[e] = self.length[e] >= self.limit[e]
        final, fcrit = self._fresh(), self._fresh(self.cd)  # true final obs (distinct from resets)
        nxt, ncrit = self._fresh(), self._fresh(self.cd)  # next obs: successor, or reset obs
        crit_kw = {}
        if self.cd:
            crit_kw = dict(critic_obs=self.cur_crit, final_critic_obs=fcrit)
        buf.add(self.cur_obs, act, rew, term, trunc, final, **crit_kw)
        for e in range(self.n):
            h = self.hist[e]
            for key, val in (
                ("obs", self.cur_obs),
                ("crit", self.cur_crit),
                ("act", act),
                ("fin", final),
                ("fcrit", fcrit),
            ):
                h[key].append(val[e].clone())
            h["rew"].append(float(rew[e]))
            h["term"].append(bool(term[e]))
            h["trunc"].append(bool(trunc[e]))
            if term[e] or trunc[e]:
                self.length[e] = 0
                self.limit[e] = self.rng.randint(1, self.max_len)
        self.cur_obs, self.cur_crit = nxt, ncrit


def ref_range(h, written, capacity, slots):
    """Valid absolute starts: successor exists and the truncations met keep their final obs."""
    newest = written - 1
    hi = newest if (h["term"][newest] or h["trunc"][newest]) else newest - 1
    kept = [t for t in range(written) if h["trunc"][t] and not h["term"][t]]
    lo = max(0, written - capacity)
    if len(kept) > slots:
        lo = max(lo, kept[len(kept) - slots - 1] + 1)
    return lo, hi


def ref_nstep(h, start, hi, n, gamma):
    ret, k = 0.0, 0
    for i in range(n):
        t = start + i
        if t > hi:
            break
        ret += gamma**i * h["rew"][t]
        k = i + 1
        if h["term"][t] or h["trunc"][t]:
            break
    last = start + k - 1
    if h["term"][last]:
        return ret, k, 0.0, None, None
    if h["trunc"][last]:
        return ret, k, 1.0, h["fin"][last], h["fcrit"][last]
    return ret, k, 1.0, h["obs"][last + 1], h["crit"][last + 1]


def check_against_reference(buf: ReplayBuffer, sim: EpisodeSim, written: int) -> tuple[int, int]:
    """Compare every valid (env, start); returns (#transitions checked, #envs with lost history)."""
    lo, hi = buf._valid_range()
    envs, starts, refs, lost = [], [], [], 0
    for e in range(sim.n):
        h = sim.hist[e]
        rlo, rhi = ref_range(h, written, buf.capacity, buf.final_obs_slots)
        assert (int(lo[e]), int(hi[e])) == (rlo, rhi), (e, written)
        lost += rlo > max(0, written - buf.capacity)
        for s in range(rlo, rhi + 1):
            envs.append(e)
            starts.append(s)
            refs.append(ref_nstep(h, s, rhi, buf.n_step, buf.gamma))
    out = buf._gather(torch.tensor(envs), torch.tensor(starts))

    def rnd(x: torch.Tensor) -> torch.Tensor:  # the reference rounded to the storage dtype
        return x.to(buf.obs_dtype).float()

    for i, (e, s) in enumerate(zip(envs, starts, strict=True)):
        h = sim.hist[e]
        ret, k, boot, nobs, ncrit = refs[i]
        assert int(out.k[i]) == k and float(out.bootstrap[i]) == boot, (e, s)
        assert float(out.rewards[i]) == pytest.approx(ret, abs=1e-5)
        assert float(out.discount[i]) == pytest.approx(buf.gamma**k, rel=1e-6)
        assert torch.equal(out.obs[i], rnd(h["obs"][s]))
        assert torch.equal(out.actions[i], h["act"][s])
        if sim.cd:
            assert torch.equal(out.critic_obs[i], rnd(h["crit"][s]))
        else:
            assert torch.equal(out.critic_obs[i], out.obs[i])
        if boot:  # after a termination next_obs is a placeholder multiplied by bootstrap = 0
            assert torch.equal(out.next_obs[i], rnd(nobs)), (e, s)
            want = rnd(ncrit) if sim.cd else out.next_obs[i]
            assert torch.equal(out.next_critic_obs[i], want)
    return len(starts), lost


@pytest.mark.parametrize(
    "n_step,obs_dtype,critic_dim,slots",
    [
        (1, torch.float32, 0, None),
        (3, torch.float32, 4, None),
        (8, torch.float32, 0, 2),
        (3, torch.bfloat16, 4, 1),
        (8, torch.bfloat16, 4, None),
    ],
)
def test_matches_bruteforce_reference(n_step, obs_dtype, critic_dim, slots) -> None:
    sim = EpisodeSim(
        num_envs=3, obs_dim=5, act_dim=2, critic_dim=critic_dim, seed=n_step + critic_dim
    )
    buf = ReplayBuffer(
        3,
        20,
        5,
        2,
        critic_obs_dim=critic_dim,
        n_step=n_step,
        gamma=0.9,
        obs_dtype=obs_dtype,
        final_obs_slots=slots,
    )
    checked = lost = 0
    for written in range(1, 75):  # 75 > 3 × capacity: wrap-around several times
        sim.step(buf)
        if written >= 2 and (written % 5 == 0 or written < 6):
            c, lo = check_against_reference(buf, sim, written)
            checked, lost = checked + c, lost + lo
    assert checked > 250
    assert (lost > 0) == (slots is not None)  # small side tables exercise recycled slots
    trunc_steps = sum(
        t and not d for h in sim.hist for t, d in zip(h["trunc"], h["term"], strict=True)
    )
    assert trunc_steps > 10 and sum(sum(h["term"]) for h in sim.hist) > 10


def test_sampled_starts_valid_uniform_and_consistent() -> None:
    sim = EpisodeSim(num_envs=4, obs_dim=3, act_dim=2, critic_dim=0, seed=7)
    buf = ReplayBuffer(4, 16, 3, 2, n_step=3, final_obs_slots=2)
    for _ in range(40):
        sim.step(buf)
    lo, hi = buf._valid_range()
    gen = torch.Generator().manual_seed(0)
    env_idx, starts = buf._sample_starts(4 * 5000, gen)
    assert torch.equal(torch.bincount(env_idx, minlength=4), torch.full((4,), 5000))
    assert bool(((starts >= lo[env_idx]) & (starts <= hi[env_idx])).all())
    for e in range(4):
        counts = torch.bincount(starts[env_idx == e] - lo[e], minlength=int(hi[e] - lo[e] + 1))
        assert len(counts) == int(hi[e] - lo[e] + 1) and counts.min() > 0  # every valid start drawn
        expected = 5000 / len(counts)
        assert (counts.float() - expected).abs().max() < 6 * expected**0.5  # roughly uniform
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    sample = buf.sample_nstep(64, generator=g1)
    direct = buf._gather(*buf._sample_starts(64, g2))
    for a, b in zip(sample, direct, strict=True):
        assert torch.equal(a, b)
    assert sample.obs.dtype == torch.float32 and sample.k.dtype == torch.int64


def test_truncated_step_bootstraps_from_true_final_obs() -> None:
    buf = ReplayBuffer(2, 8, 2, 1, n_step=3, gamma=0.5, obs_dtype=torch.bfloat16)
    zero = torch.zeros(2, dtype=torch.bool)
    step_obs = [torch.full((2, 2), float(i)) for i in range(4)]
    final = torch.tensor(
        [[100.0, 101.0], [-1.0, -1.0]]
    )  # env 0 truncates at step 1 with this final obs
    for t in range(4):
        trunc = torch.tensor([t == 1, False])
        buf.add(
            step_obs[t],
            torch.zeros(2, 1),
            torch.ones(2),
            zero,
            trunc,
            final if t == 1 else step_obs[t],
        )
    out = buf._gather(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))
    assert out.k.tolist() == [2, 1, 3] and out.bootstrap.tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(out.next_obs[0], final[0]) and torch.equal(out.next_obs[1], final[0])
    assert not torch.equal(out.next_obs[0], step_obs[2][0])  # not the next episode's first obs
    assert torch.equal(out.next_obs[2], step_obs[3][1])
    assert out.rewards.tolist() == [1.5, 1.0, 1.75]
    assert out.discount.tolist() == [0.25, 0.5, 0.125]


def test_window_never_crosses_write_pointer() -> None:
    buf = ReplayBuffer(1, 5, 1, 1, n_step=3, gamma=1.0)
    zero = torch.zeros(1, dtype=torch.bool)
    for t in range(7):  # steps 0..6; columns now hold steps 5, 6, 2, 3, 4
        buf.add(
            torch.full((1, 1), float(t)),
            torch.zeros(1, 1),
            torch.full((1,), float(t)),
            zero,
            zero,
            torch.zeros(1, 1),
        )
    lo, hi = buf._valid_range()
    assert (int(lo[0]), int(hi[0])) == (2, 5)  # step 6 has no successor yet
    out = buf._gather(torch.zeros(3, dtype=torch.long), torch.tensor([3, 4, 5]))
    assert out.k.tolist() == [3, 2, 1]
    assert out.rewards.tolist() == [
        3 + 4 + 5,
        4 + 5,
        5,
    ]  # never step 2's reward from the wrapped column
    assert out.next_obs[:, 0].tolist() == [6.0, 6.0, 6.0]
    term = torch.ones(1, dtype=torch.bool)
    buf.add(
        torch.full((1, 1), 7.0),
        torch.zeros(1, 1),
        torch.full((1,), 7.0),
        term,
        zero,
        torch.zeros(1, 1),
    )
    assert int(buf._valid_range()[1][0]) == 7  # a terminated newest step needs no successor
    out = buf._gather(torch.zeros(1, dtype=torch.long), torch.tensor([7]))
    assert out.k.tolist() == [1] and out.bootstrap.tolist() == [0.0]


def test_config_and_input_errors() -> None:
    buf = ReplayBuffer(4, 8, 3, 2)
    with pytest.raises(RuntimeError, match="at least 2"):
        buf.sample_nstep(8)
    with pytest.raises(ValueError, match="final_obs"):
        buf.add(
            torch.zeros(4, 3), torch.zeros(4, 2), torch.zeros(4), torch.zeros(4), torch.zeros(4)
        )
    with pytest.raises(ConfigError, match=r"final_obs_slots=9"):
        ReplayBuffer(4, 8, 3, 2, final_obs_slots=9)
    with pytest.raises(ConfigError) as err:
        ReplayBuffer(4096, 10240, 123, 37, free_bytes=10**9, max_episode_length=1000)
    msg = str(err.value)
    needed = ReplayBuffer.estimate_bytes(4096, 10240, 123, 37, max_episode_length=1000)
    assert "\n" not in msg and "algo.buffer_size=10240" in msg and "env.num_envs=4096" in msg
    assert f"needs {needed} bytes" in msg and "only 1000000000 bytes" in msg and "PER ENV" in msg


def test_replay_settings_are_checked_by_the_configs() -> None:
    """The buffer's sizes, gamma and dtypes come from configs that check them once."""
    with pytest.raises(ConfigError, match=r"algo\.batch_size=10 .*env\.num_envs=4"):
        check_batch_divides(10, 4)
    with pytest.raises(ConfigError, match=r"algo\.buffer_size=3 .*algo\.n_step=3"):
        AlgoConfig(buffer_size=3, n_step=3)
    with pytest.raises(ConfigError, match=r"algo\.gamma"):
        AlgoConfig(gamma=1.5)
    with pytest.raises(ConfigError, match=r"algo\.replay_obs_dtype='float16'"):
        AlgoConfig(replay_obs_dtype="float16")
    with pytest.raises(ConfigError, match=r"algo\.replay_action_dtype='int8'"):
        AlgoConfig(replay_action_dtype="int8")
    with pytest.raises(ConfigError, match=r"env\.num_envs=0"):
        EnvConfig(num_envs=0)


@pytest.mark.parametrize(
    "critic_dim,obs_dtype,slots", [(0, torch.float32, 3), (6, torch.bfloat16, 40000)]
)
def test_estimate_matches_allocation(critic_dim, obs_dtype, slots) -> None:
    kw = dict(critic_obs_dim=critic_dim, obs_dtype=obs_dtype, final_obs_slots=slots)
    buf = ReplayBuffer(3, 40000, 7, 2, action_dtype=torch.float16, **kw)
    state = {k: v for k, v in buf.state_dict().items() if k != "meta"}
    allocated = sum(t.numel() * t.element_size() for t in state.values())
    assert (
        ReplayBuffer.estimate_bytes(3, 40000, 7, 2, action_dtype=torch.float16, **kw) == allocated
    )
    assert buf.bytes_per_transition == allocated / (3 * 40000)
    assert buf.slot.dtype == (torch.int16 if slots < 32768 else torch.int32)


def test_bytes_per_transition_against_reference() -> None:
    # FastTD3-style buffer, G1 flat (123 obs, 37 actions): 2·123·4 + 37·4 + 4 + 8 + 8 = 1152 bytes.
    assert ReplayBuffer.reference_transition_bytes(123, 37) == 1152
    assert ReplayBuffer.reference_transition_bytes(123, 37, 126) == 2 * 249 * 4 + 148 + 20
    for critic_dim, dtype, bound in [
        (0, torch.bfloat16, 0.36),
        (126, torch.float32, 0.55),
        (126, torch.bfloat16, 0.31),
    ]:
        est = ReplayBuffer.estimate_bytes(
            4096,
            10240,
            123,
            37,
            critic_obs_dim=critic_dim,
            obs_dtype=dtype,
            max_episode_length=1000,
        )
        ratio = est / (4096 * 10240) / ReplayBuffer.reference_transition_bytes(123, 37, critic_dim)
        assert ratio <= bound, (critic_dim, dtype, ratio)


def test_state_dict_resumes_identically() -> None:
    def make(obs_dim=4):
        return ReplayBuffer(
            3,
            10,
            obs_dim,
            2,
            critic_obs_dim=3,
            n_step=3,
            obs_dtype=torch.bfloat16,
            final_obs_slots=2,
        )

    sim = EpisodeSim(num_envs=3, obs_dim=4, act_dim=2, critic_dim=3, seed=11)
    a = make()
    for _ in range(23):
        sim.step(a)
    b = make()
    b.load_state_dict(a.state_dict())
    assert b.num_added == a.num_added == 23
    calls = []  # record the next 6 steps once, then feed the same steps to both buffers
    recorder = type("Recorder", (), {"add": lambda self, *args, **kw: calls.append((args, kw))})()
    for _ in range(6):
        sim.step(recorder)
    for buf in (a, b):
        for args, kw in calls:
            buf.add(*args, **kw)
    assert a.num_added == b.num_added == 29
    outs = [buf.sample_nstep(30, generator=torch.Generator().manual_seed(1)) for buf in (a, b)]
    for x, y in zip(*outs, strict=True):
        assert torch.equal(x, y)
    with pytest.raises(CheckpointError, match="obs_dim"):
        make(obs_dim=5).load_state_dict(a.state_dict())


@pytest.mark.slow
def test_sampling_compiles_fullgraph() -> None:
    sim = EpisodeSim(num_envs=2, obs_dim=3, act_dim=1, critic_dim=0, seed=5)
    buf = ReplayBuffer(2, 12, 3, 1, n_step=3)
    for _ in range(20):
        sim.step(buf)
    env_idx, starts = buf._sample_starts(8, torch.Generator().manual_seed(0))
    compiled = torch.compile(buf._gather, fullgraph=True, backend="eager")
    for a, b in zip(compiled(env_idx, starts), buf._gather(env_idx, starts), strict=True):
        assert torch.equal(a, b)
