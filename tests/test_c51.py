"""C51 support and categorical projection against a brute-force per-sample, per-atom reference."""

from __future__ import annotations

import math

import pytest
import torch

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn.distributional import C51Support, expected_value, project_distribution


def reference_projection(probs, rewards, bootstrap, discount, v_min, v_max, num_atoms):
    """Plain Python loop: each source atom's mass goes to floor(b)/ceil(b), integral b → one atom."""
    dz = (v_max - v_min) / (num_atoms - 1)
    out = torch.zeros(probs.shape, dtype=torch.float64)
    for i in range(probs.shape[0]):
        for j in range(num_atoms):
            z = v_min + j * dz
            tz = float(rewards[i]) + float(bootstrap[i]) * float(discount[i]) * z
            tz = min(max(tz, v_min), v_max)
            b = (tz - v_min) / dz
            lo, hi = math.floor(b), math.ceil(b)
            p = float(probs[i, j])
            if lo == hi:
                out[i, lo] += p
            else:
                out[i, lo] += p * (hi - b)
                out[i, hi] += p * (b - lo)
    return out


def random_case(batch, num_atoms, gen, reward_scale=15.0):
    probs = torch.softmax(torch.randn(batch, num_atoms, generator=gen) * 2, dim=-1)
    rewards = (torch.rand(batch, generator=gen) * 2 - 1) * reward_scale
    bootstrap = (torch.rand(batch, generator=gen) < 0.7).float()
    k = torch.randint(1, 9, (batch,), generator=gen)
    discount = 0.99 ** k.double()
    return probs, rewards, bootstrap, discount.float()


def test_support_buffers_and_validation() -> None:
    s = C51Support(-10.0, 10.0, 251)
    assert torch.allclose(s.support, torch.linspace(-10, 10, 251))
    assert s.delta_z.item() == pytest.approx(20 / 250)
    assert {n for n, _ in s.named_buffers()} == {"support", "delta_z"}
    assert s.atoms(dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ConfigError, match=r"algo\.v_min=.*algo\.v_max"):
        C51Support(1.0, 1.0, 51)
    with pytest.raises(ConfigError, match=r"algo\.v_min"):
        C51Support(5.0, -5.0, 51)
    with pytest.raises(ConfigError, match="num_atoms"):
        C51Support(-1.0, 1.0, 1)


@pytest.mark.parametrize(
    "num_atoms,v_min,v_max", [(51, -10.0, 10.0), (101, -20.0, 20.0), (7, 0.0, 3.0)]
)
def test_projection_matches_bruteforce(num_atoms: int, v_min: float, v_max: float) -> None:
    gen = torch.Generator().manual_seed(num_atoms)
    support = C51Support(v_min, v_max, num_atoms)
    # Rewards up to ±15 push targets outside [v_min, v_max] on both sides for the small supports.
    probs, rewards, bootstrap, discount = random_case(64, num_atoms, gen)
    got = project_distribution(probs, rewards, bootstrap, discount, support)
    want = reference_projection(probs, rewards, bootstrap, discount, v_min, v_max, num_atoms)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones(64), atol=1e-5, rtol=0)


def test_integral_targets_put_all_mass_on_one_atom() -> None:
    # Δz = 1: integer rewards with discount 1 land exactly on atoms, including both ends.
    support = C51Support(-10.0, 10.0, 21)
    probs = torch.zeros(4, 21)
    probs[:, 10] = 1.0  # all mass at z = 0
    rewards = torch.tensor([3.0, -10.0, 10.0, 0.0])
    out = project_distribution(probs, rewards, torch.ones(4), torch.ones(4), support)
    for row, atom in enumerate([13, 0, 20, 10]):
        expect = torch.zeros(21)
        expect[atom] = 1.0
        assert torch.equal(out[row], expect), (row, out[row])
    # Every source atom shifted by an integer: the distribution is an exact shift (with clamping).
    probs = torch.softmax(torch.randn(3, 21), -1)
    out = project_distribution(
        probs, torch.tensor([2.0, -4.0, 0.0]), torch.ones(3), torch.ones(3), support
    )
    want = reference_projection(probs, [2.0, -4.0, 0.0], [1, 1, 1], [1, 1, 1], -10.0, 10.0, 21)
    torch.testing.assert_close(out.double(), want, atol=1e-6, rtol=0)
    assert torch.allclose(out[0, 2:20], probs[0, :18]) and out[0, :2].abs().max() == 0
    assert torch.allclose(
        out[0, 20], probs[0, 18:].sum()
    )  # shifted past v_max → clamped to the top
    assert torch.allclose(out[2], probs[2])


def test_bootstrap_zero_collapses_to_reward() -> None:
    support = C51Support(-10.0, 10.0, 51)
    probs = torch.softmax(torch.randn(5, 51), -1)
    rewards = torch.tensor([0.3, -2.7, 12.0, -15.0, 4.0])  # two outside the support
    out = project_distribution(probs, rewards, torch.zeros(5), torch.full((5,), 0.9), support)
    clamped = rewards.clamp(-10, 10)
    torch.testing.assert_close(expected_value(out, support), clamped, atol=1e-5, rtol=0)
    assert (out > 0).sum(-1).le(2).all()  # a Dirac at the reward → at most two neighbours


def test_mean_preserved_inside_support() -> None:
    gen = torch.Generator().manual_seed(0)
    support = C51Support(-10.0, 10.0, 251)
    probs, _, bootstrap, discount = random_case(256, 251, gen)
    # |r| + γ^k·|z| ≤ 10 keeps every shifted atom inside the support: no clamping, mean is exact.
    rewards = (torch.rand(256, generator=gen) * 2 - 1) * (10 - 10 * discount * bootstrap)
    out = project_distribution(probs, rewards, bootstrap, discount, support)
    target_mean = rewards + bootstrap * discount * expected_value(probs, support)
    torch.testing.assert_close(expected_value(out, support), target_mean, atol=1e-4, rtol=0)
    # Outside the support the projected mean equals the mean of the *clamped* shifted atoms.
    rewards = (torch.rand(256, generator=gen) * 2 - 1) * 25
    out = project_distribution(probs, rewards, bootstrap, discount, support)
    tz = (rewards[:, None] + (bootstrap * discount)[:, None] * support.support).clamp(-10, 10)
    torch.testing.assert_close(
        expected_value(out, support), (probs * tz).sum(-1), atol=1e-4, rtol=0
    )


def test_bf16_probs_and_ensemble_axis() -> None:
    gen = torch.Generator().manual_seed(3)
    support = C51Support(-10.0, 10.0, 101)
    probs, rewards, bootstrap, discount = random_case(32, 101, gen)
    ens = torch.stack(
        [probs, torch.softmax(torch.randn(32, 101, generator=gen), -1)]
    )  # [E=2, B, A]
    out = project_distribution(ens.bfloat16(), rewards, bootstrap, discount, support)
    assert out.shape == (2, 32, 101) and out.dtype == torch.float32
    for e in range(2):
        src = ens[e].bfloat16().float()
        want = reference_projection(src, rewards, bootstrap, discount, -10.0, 10.0, 101)
        torch.testing.assert_close(out[e].double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.sum(-1), ens.bfloat16().float().sum(-1), atol=1e-5, rtol=0)


def test_expected_value_from_logits() -> None:
    support = C51Support(-1.0, 1.0, 3)
    logits = torch.tensor([[0.0, 0.0, math.log(3.0)]])
    assert expected_value(logits, support, from_logits=True).item() == pytest.approx(2 / 5)
    assert expected_value(torch.tensor([0.25, 0.25, 0.5]), support).item() == pytest.approx(0.25)


def test_module_moves_with_to() -> None:
    support = C51Support(-10.0, 10.0, 11).to(torch.float64)
    assert support.support.dtype == torch.float64
    out = project_distribution(
        torch.full((2, 11), 1 / 11), torch.zeros(2), torch.ones(2), torch.ones(2), support
    )
    torch.testing.assert_close(out, torch.full((2, 11), 1 / 11))


@pytest.mark.slow
def test_compiles_without_graph_breaks() -> None:
    support = C51Support(-10.0, 10.0, 51)
    gen = torch.Generator().manual_seed(5)
    probs, rewards, bootstrap, discount = random_case(16, 51, gen)

    def fn(p, r, b, d):
        return project_distribution(p, r, b, d, support)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(
        compiled(probs, rewards, bootstrap, discount), fn(probs, rewards, bootstrap, discount)
    )
