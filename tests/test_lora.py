"""LoRALinear: merge, init, LoRA-WN, fallback, and Polyak (PolyakUpdater) on merged targets."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from fast_lora_td3.algos.common import PolyakUpdater
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn import LoRALinear, merge_lora_, project_weights_


def _brute_merged(layer: LoRALinear) -> torch.Tensor:
    """W0 + (α/r)(A B)ᵀ, element by element over the rank, in float64."""
    w0 = layer.base_weight.double()
    a, b = layer.lora_A.detach().double(), layer.lora_B.detach().double()
    delta = torch.zeros_like(w0)
    for k in range(layer.rank):  # ΔW[j, i] = Σ_k A[i, k] B[k, j]
        delta += b[..., k, :].unsqueeze(-1) * a[..., :, k].unsqueeze(-2)
    return w0 + (layer.alpha / layer.rank) * delta


def _row_norms(w: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(w.double(), dim=-1)


def _random_steps(layer: torch.nn.Module, in_features: int, steps: int, project: bool) -> None:
    """AdamW steps on a random regression loss (large lr, so the adapters move a lot)."""
    opt = torch.optim.AdamW([p for p in layer.parameters() if p.requires_grad], lr=3e-2)
    for _ in range(steps):
        x = torch.randn(16, in_features)
        loss = (layer(x) - 1.0).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if project:
            project_weights_(layer)


@pytest.mark.parametrize("ensemble_size", [None, 3])
def test_merged_weight_matches_brute_force(ensemble_size: int | None) -> None:
    torch.manual_seed(0)
    layer = LoRALinear(12, 10, rank=4, alpha=7.0, ensemble_size=ensemble_size)
    torch.testing.assert_close(
        layer.effective_weight().double(), _brute_merged(layer), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    ("ensemble_size", "per_member_batch"), [(None, False), (2, False), (2, True)]
)
def test_forward_equals_unmerged_two_gemm_formula(
    ensemble_size: int | None, per_member_batch: bool
) -> None:

    torch.manual_seed(1)
    layer = LoRALinear(9, 11, rank=3, alpha=5.0, ensemble_size=ensemble_size)
    x = torch.randn(2, 6, 9) if per_member_batch else torch.randn(6, 9)
    xa = x.unsqueeze(0) if ensemble_size is not None and not per_member_batch else x
    ref = (
        xa @ layer.base_weight.transpose(-1, -2)
        + layer.bias
        + (5.0 / 3.0) * (xa @ layer.lora_A) @ layer.lora_B
    )
    y = layer(x)
    torch.testing.assert_close(y, ref.expand_as(y), rtol=1e-5, atol=1e-5)
    # Same gradients for the adapters as the two-GEMM formula.
    grads = torch.autograd.grad(y.square().sum(), [layer.lora_A, layer.lora_B])
    ref_grads = torch.autograd.grad(ref.expand_as(y).square().sum(), [layer.lora_A, layer.lora_B])
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_base_is_buffer_and_only_adapters_and_bias_train() -> None:
    layer = LoRALinear(8, 6, rank=2, ensemble_size=2)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"lora_A", "lora_B", "bias"}
    assert "base_weight" in dict(layer.named_buffers())
    assert not layer.base_weight.requires_grad
    assert layer.lora_parameters() == [layer.lora_A, layer.lora_B]
    assert layer.base_weight.shape == (2, 6, 8)
    assert layer.lora_A.shape == (2, 8, 2) and layer.lora_B.shape == (2, 2, 6)
    assert layer.bias.shape == (2, 1, 6)
    assert "base_weight" in layer.state_dict()


@pytest.mark.parametrize("kappa", [0.5, 0.2])
@pytest.mark.parametrize("ensemble_size", [None, 2])
def test_paper_init_row_norms(kappa: float, ensemble_size: int | None) -> None:
    torch.manual_seed(2)
    layer = LoRALinear(
        40, 24, rank=6, kernel_init_scale=kappa, ensemble_size=ensemble_size, weight_norm="none"
    )
    expected = torch.full(layer.base_weight.shape[:-1], math.sqrt(kappa), dtype=torch.float64)
    torch.testing.assert_close(_row_norms(layer.base_weight), expected, rtol=1e-5, atol=1e-6)
    delta = _brute_merged(layer) - layer.base_weight.double()
    torch.testing.assert_close(_row_norms(delta), expected, rtol=1e-5, atol=1e-6)
    if ensemble_size is not None:  # members are drawn independently
        assert not torch.allclose(layer.base_weight[0], layer.base_weight[1])
        assert not torch.allclose(layer.lora_A[0], layer.lora_A[1])


def test_zero_b_init_gives_zero_delta() -> None:
    torch.manual_seed(3)
    layer = LoRALinear(16, 12, rank=4, init="zero_b", ensemble_size=2)
    assert torch.count_nonzero(layer.lora_B) == 0
    assert torch.count_nonzero(layer.delta_weight()) == 0
    assert torch.count_nonzero(layer.lora_A) > 0  # A random so B receives gradients
    torch.testing.assert_close(layer.effective_weight(), layer.base_weight)
    bound = 1.0 / math.sqrt(16)  # nn.Linear's default base
    assert layer.base_weight.abs().max() <= bound


@pytest.mark.parametrize("rank", [0, -1, 8, 9])
def test_bad_rank_raises_config_error(rank: int) -> None:
    with pytest.raises(ConfigError, match=r"critic\.rank") as info:
        LoRALinear(8, 20, rank=rank)
    assert "0 < rank < 8" in str(info.value)


def test_bad_init_and_weight_norm_raise() -> None:
    with pytest.raises(ConfigError, match=r"critic\.lora_init"):
        LoRALinear(8, 8, rank=2, init="kaiming")
    with pytest.raises(ConfigError, match=r"critic\.weight_norm"):
        LoRALinear(8, 8, rank=2, weight_norm="sometimes")


@pytest.mark.parametrize("ensemble_size", [None, 2])
def test_lora_wn_project_keeps_rows_unit_after_each_step(ensemble_size: int | None) -> None:
    torch.manual_seed(4)
    layer = LoRALinear(20, 14, rank=4, ensemble_size=ensemble_size, weight_norm="project")
    ones = torch.ones(layer.base_weight.shape[:-1], dtype=torch.float64)
    torch.testing.assert_close(_row_norms(layer.effective_weight()), ones, atol=1e-5, rtol=0)
    opt = torch.optim.AdamW(layer.parameters(), lr=3e-2)
    base0 = layer.base_weight.clone()
    for _ in range(5):
        loss = (layer(torch.randn(16, 20)) - 1.0).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        a_before = layer.lora_A.detach().clone()
        project_weights_(layer)
        torch.testing.assert_close(layer.lora_A, a_before)  # LoRA-WN only rescales B
        w = layer.effective_weight()
        torch.testing.assert_close(_row_norms(w), ones, atol=1e-5, rtol=0)
        # The projected rows are w0 + c·Δw with the fallback unused here.
        assert not layer.fallback_rows.any()
        torch.testing.assert_close(w.double(), _brute_merged(layer), atol=1e-5, rtol=1e-5)
    assert torch.equal(layer.base_weight, base0)


def test_lora_wn_forward_variant_rows_unit() -> None:
    torch.manual_seed(5)
    layer = LoRALinear(20, 14, rank=4, ensemble_size=2, weight_norm="forward")
    for _ in range(3):
        _random_steps(layer, 20, 2, project=True)
        b_before = layer.lora_B.detach().clone()
        project_weights_(layer)
        assert torch.equal(layer.lora_B, b_before)  # project_ is a no-op in this mode
        norms = _row_norms(layer.effective_weight())
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)
        x = torch.randn(5, 20)
        ref = x @ torch.nn.functional.normalize(_brute_merged(layer).float(), dim=-1).transpose(
            -1, -2
        )
        torch.testing.assert_close(layer(x), ref + layer.bias, atol=1e-5, rtol=1e-5)


def _brute_root(w0: np.ndarray, dw: np.ndarray) -> float | None:
    """Positive root of c²‖Δ‖² + 2c⟨w0,Δ⟩ + ‖w0‖² − 1 closest to 1, or None (numpy polynomial)."""
    roots = np.roots([dw @ dw, 2 * (w0 @ dw), w0 @ w0 - 1.0])
    pos = [r.real for r in roots if abs(r.imag) < 1e-12 and r.real > 0]
    return min(pos, key=lambda r: abs(r - 1.0)) if pos else None


def test_lora_wn_roots_and_fallback_match_brute_force() -> None:
    torch.manual_seed(6)
    layer = LoRALinear(10, 8, rank=3, weight_norm="project")
    with torch.no_grad():
        d = torch.nn.functional.normalize(layer.delta_weight(), dim=-1)
        base = torch.nn.functional.normalize(torch.randn(8, 10), dim=-1) * math.sqrt(0.5)
        base[0:3] = 1.3 * d[0:3]  # ‖w0‖ > 1 and ΔW along +w0: both roots negative → fallback
        base[3] = -1.3 * d[3]  # ΔW along −w0: two positive roots, the one closer to 1 wins
        layer.base_weight.copy_(base)  # rows 4-7: ‖w0‖ < 1, exactly one positive root
    w0 = layer.base_weight.double().numpy()
    dw = (_brute_merged(layer) - layer.base_weight.double()).numpy()
    expected = [_brute_root(w0[j], dw[j]) for j in range(8)]
    assert [e is None for e in expected] == [True] * 3 + [False] * 5
    b_before = layer.lora_B.detach().double().clone()
    layer.project_()
    assert layer.fallback_rows.tolist() == [True] * 3 + [False] * 5
    for j, root in enumerate(expected):
        c = 1.0 if root is None else root
        torch.testing.assert_close(
            layer.lora_B[:, j].double(), c * b_before[:, j], rtol=1e-4, atol=0
        )
    # Row 3's roots are (1.3 ± 1)/‖Δw‖: the projection took the one nearer 1.
    dn = float(np.linalg.norm(dw[3]))
    roots = sorted([0.3 / dn, 2.3 / dn], key=lambda r: abs(r - 1.0))
    assert expected[3] == pytest.approx(roots[0], rel=1e-6)
    norms = _row_norms(layer.effective_weight())
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def test_lora_wn_zero_delta_falls_back_to_forward_normalisation() -> None:
    torch.manual_seed(7)
    layer = LoRALinear(12, 9, rank=2, ensemble_size=2, weight_norm="project")
    with torch.no_grad():
        layer.lora_B.zero_()
    layer.project_()
    assert layer.fallback_rows.all()  # ΔW = 0: no root moves the rows
    norms = _row_norms(layer.effective_weight())
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)
    x = torch.randn(4, 12)
    ref = x @ torch.nn.functional.normalize(layer.base_weight, dim=-1).transpose(-1, -2)
    torch.testing.assert_close(layer(x), ref + layer.bias, atol=1e-5, rtol=1e-5)
    for _ in range(3):  # after steps the rows find their root; every row stays unit either way
        _random_steps(layer, 12, 1, project=True)
        norms = _row_norms(layer.effective_weight())
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)
    assert not layer.fallback_rows.any()


@pytest.mark.parametrize(
    ("init", "kappa", "match"),
    [("zero_b", 0.5, r"critic\.lora_init=zero_b"), ("paper", 1.0, r"critic\.kernel_init_scale")],
)
def test_lora_wn_rejects_bases_on_the_unit_sphere(init: str, kappa: float, match: str) -> None:
    """zero_b (ΔW = 0) and κ >= 1 leave LoRA-WN without a well-defined root: one-line ConfigError."""
    with pytest.raises(ConfigError, match=match) as info:
        LoRALinear(64, 256, rank=16, init=init, kernel_init_scale=kappa, weight_norm="project")
    assert "\n" not in str(info.value)
    LoRALinear(64, 256, rank=16, init=init, kernel_init_scale=kappa, weight_norm="forward")


def _one_small_step(layer: LoRALinear, seed: int) -> torch.Tensor:
    """Add a random 1e-3 step to A and B, project, and return the factor applied to B's columns."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.lora_A, layer.lora_B):
            p.add_(1e-3 * torch.randn(p.shape, generator=gen))
        b_before = layer.lora_B.detach().clone()
        layer.project_()
        return (layer.lora_B / b_before).mean(-2)  # every entry of a column got the same factor


@pytest.mark.parametrize("kappa", [0.5, 0.9])
def test_lora_wn_small_step_scenario_is_well_conditioned(kappa: float) -> None:
    """Issue 10's scenario (64→256 layer, one random 1e-3 step): the scale factors stay near 1 and
    no row falls back (before the fix, unit base rows gave factors 1e-5…150 and 36 % fallbacks)."""
    torch.manual_seed(11)
    layer = LoRALinear(64, 256, rank=16, kernel_init_scale=kappa, weight_norm="project")
    c = _one_small_step(layer, seed=12)
    assert not layer.fallback_rows.any()
    assert (c - 1.0).abs().max() < 0.1  # one 1e-3 step moves each row by a few percent at most
    _unit = _row_norms(layer.effective_weight())
    torch.testing.assert_close(_unit, torch.ones_like(_unit), atol=1e-5, rtol=0)


def test_lora_wn_unit_base_rows_fall_back_instead_of_noise_roots() -> None:
    """A base already on the unit sphere (loaded by hand) has the roots 0 and a reflection: the
    projection must leave B alone and forward-normalise those rows, not pick a rounding-noise root."""
    torch.manual_seed(13)
    layer = LoRALinear(64, 256, rank=16, weight_norm="project")
    with torch.no_grad():
        layer.base_weight.copy_(torch.nn.functional.normalize(layer.base_weight, dim=-1))
    c = _one_small_step(layer, seed=14)
    assert layer.fallback_rows.all()
    torch.testing.assert_close(c, torch.ones_like(c))
    w = layer.effective_weight()
    torch.testing.assert_close(
        _row_norms(w), torch.ones(256, dtype=torch.float64), atol=1e-5, rtol=0
    )
    ref = torch.nn.functional.normalize(_brute_merged(layer), dim=-1)
    torch.testing.assert_close(w.double(), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("weight_norm", ["none", "project", "forward"])
def test_merged_target_polyak(weight_norm: str) -> None:
    torch.manual_seed(8)
    online = LoRALinear(10, 7, rank=3, ensemble_size=2, weight_norm=weight_norm)
    target = copy.deepcopy(online)
    merge_lora_(target)
    assert target.merged and torch.count_nonzero(target.lora_B) == 0
    x = torch.randn(6, 10)
    torch.testing.assert_close(target(x), online(x), atol=1e-5, rtol=1e-5)
    _random_steps(online, 10, 3, project=True)
    with torch.no_grad():
        online.bias.add_(0.1)  # the bias (a dense parameter) is mixed directly
    tau = 0.1
    w_on = online.effective_weight().detach().clone()
    w_tgt = target.effective_weight().detach().clone()
    b_on, b_tgt = online.bias.detach().clone(), target.bias.detach().clone()
    PolyakUpdater(online, target).update(tau)
    mixed = tau * w_on + (1 - tau) * w_tgt
    torch.testing.assert_close(target.effective_weight(), mixed, atol=1e-6, rtol=1e-6)
    assert torch.count_nonzero(target.lora_B) == 0
    torch.testing.assert_close(target.bias, tau * b_on + (1 - tau) * b_tgt)
    # The target's output is the dense layer with the Polyak mix of the effective weights.
    ref = x @ mixed.transpose(-1, -2) + target.bias
    torch.testing.assert_close(target(x), ref, atol=1e-5, rtol=1e-5)
    project_weights_(target)  # a merged target is never re-projected
    torch.testing.assert_close(target.effective_weight(), mixed, atol=1e-6, rtol=1e-6)


def test_polyak_requires_merged_target() -> None:
    online = LoRALinear(10, 7, rank=3)
    with pytest.raises(ValueError, match="merged target"):
        PolyakUpdater(online, copy.deepcopy(online))


def test_forward_and_project_trace_without_graph_breaks() -> None:
    """fullgraph tracing fails on host syncs or data-dependent Python branches."""
    torch._dynamo.reset()
    layer = LoRALinear(10, 7, rank=3, ensemble_size=2, weight_norm="project")
    x = torch.randn(4, 10)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x))
    project = torch.compile(layer.project_, backend="eager", fullgraph=True)
    project()
    norms = _row_norms(layer.effective_weight())
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def _reference_linear(x, base, a, b, bias, rows, scaling, mode):
    """Autograd through the merged weight (the pre-issue-10 forward)."""
    from fast_lora_td3.nn.layers import ensemble_linear, l2_normalize

    w = base + scaling * (b.transpose(-1, -2) @ a.transpose(-1, -2))
    if mode == "forward":
        w = l2_normalize(w)
    elif mode == "project":
        w = torch.where(rows.unsqueeze(-1), l2_normalize(w), w)
    return ensemble_linear(x, w, bias)


@pytest.mark.parametrize("mode", ["none", "forward", "project"])
@pytest.mark.parametrize(
    ("ensemble_size", "x_shape"),
    [(None, (5, 7)), (None, (2, 5, 7)), (3, (5, 7)), (3, (3, 5, 7))],
)
@pytest.mark.parametrize("bias", [True, False])
def test_low_rank_backward_matches_autograd_through_merged_weight(
    mode: str, ensemble_size: int | None, x_shape: tuple, bias: bool
) -> None:
    """Issue 10: the adapter gradients skip the full dW; values and gradients must not change
    (float64 against autograd through the merged weight, and torch.autograd.gradcheck)."""
    from fast_lora_td3.nn.lora_autograd import lora_linear

    torch.manual_seed(11)
    lead, d = (() if ensemble_size is None else (ensemble_size,)), torch.float64
    x = torch.randn(*x_shape, dtype=d, requires_grad=True)
    base = torch.randn(*lead, 6, 7, dtype=d) * 0.3
    a = torch.randn(*lead, 7, 2, dtype=d, requires_grad=True)
    b = torch.randn(*lead, 2, 6, dtype=d, requires_grad=True)
    shape = (6,) if ensemble_size is None else (ensemble_size, 1, 6)
    c = torch.randn(*shape, dtype=d, requires_grad=True) if bias else None
    rows = torch.arange(6).expand(*lead, 6) % 2 == 0  # half the rows normalised in "project"
    args = (x, base, a, b, c, rows, 0.7, mode)
    out, ref = lora_linear(*args), _reference_linear(*args)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    inputs = [t for t in (x, a, b, c) if t is not None]
    grad_out = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, inputs, grad_out),
        torch.autograd.grad(ref, inputs, grad_out),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: lora_linear(*t, rows, 0.7, mode), (x, base, a, b, c))


def test_layer_forward_without_adapter_grads_gives_input_grad_only() -> None:
    """The actor update runs the critic with detached adapters: only dx flows."""
    torch.manual_seed(12)
    layer = LoRALinear(8, 6, rank=2, ensemble_size=2, weight_norm="project")
    x = torch.randn(4, 8, requires_grad=True)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    params.update(dict(layer.named_buffers()))
    y = torch.func.functional_call(layer, params, (x,))
    (dx,) = torch.autograd.grad(y.sum(), x)
    ref = torch.autograd.grad(
        ensemble_linear_ref(x, layer.effective_weight().detach(), layer.bias.detach()).sum(), x
    )[0]
    torch.testing.assert_close(dx, ref)


def ensemble_linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bi,eoi->ebo", x, w) + bias


def test_project_mode_without_flagged_rows_skips_exactly_on_cpu() -> None:
    """Eager CPU skips the fallback work when no row is flagged: same values and gradients."""
    from fast_lora_td3.nn.lora_autograd import lora_linear, none_flagged

    torch.manual_seed(13)
    d = torch.float64
    x = torch.randn(2, 5, 7, dtype=d, requires_grad=True)
    base = torch.randn(2, 6, 7, dtype=d) * 0.3
    a = torch.randn(2, 7, 2, dtype=d, requires_grad=True)
    b = torch.randn(2, 2, 6, dtype=d, requires_grad=True)
    rows = torch.zeros(2, 6, dtype=torch.bool)
    assert none_flagged(rows) and not none_flagged(rows | (torch.arange(6) == 3))
    args = (x, base, a, b, None, rows, 0.7, "project")
    out, ref = lora_linear(*args), _reference_linear(*args)
    assert torch.equal(out, ref)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, a, b), grad_out)
    want = torch.autograd.grad(ref, (x, a, b), grad_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
