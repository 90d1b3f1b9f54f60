"""SimbaV2 blocks: Scaler init, HyperDense projection, formulas, extreme inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn import (
    HyperDense,
    LerpBlock,
    Scaler,
    SimbaV2Embedder,
    SimbaV2Encoder,
    SimbaV2Head,
    l2_normalize,
    project_weights_,
)

LORA = {
    "rank": 4,
    "alpha": 4.0,
    "init": "paper",
    "kernel_init_scale": 0.5,
    "weight_norm": "project",
}


def _unit_rows(w: torch.Tensor, atol: float = 1e-5) -> None:
    norms = torch.linalg.vector_norm(w.double(), dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=atol, rtol=0)


def _train(module: torch.nn.Module, in_dim: int, steps: int) -> None:
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=5e-2)
    for _ in range(steps):
        loss = (module(torch.randn(32, in_dim)) - 0.3).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        project_weights_(module)


@pytest.mark.parametrize(("init", "scale"), [(0.25, 0.25), (1.0 / 3.0, 1.0 / 8.0), (1.0, 1.0)])
@pytest.mark.parametrize("ensemble_size", [None, 2])
def test_scaler_effective_init_equals_init(
    init: float, scale: float, ensemble_size: int | None
) -> None:
    s = Scaler(6, init=init, scale=scale, ensemble_size=ensemble_size)
    # Stored at `scale` (the reference port stores init·scale → effective init²).
    assert torch.all(s.scaler == scale)
    torch.testing.assert_close(s.effective(), torch.full_like(s.scaler, init))
    x = torch.randn(3, 6)
    torch.testing.assert_close(s(x), (x * init).expand(s(x).shape))
    assert s.scaler.shape == ((6,) if ensemble_size is None else (2, 1, 6))


@pytest.mark.parametrize(("in_f", "out_f"), [(8, 32), (32, 8), (16, 16)])
@pytest.mark.parametrize("ensemble_size", [None, 2])
def test_hyperdense_rows_unit_at_init_and_after_steps(
    in_f: int, out_f: int, ensemble_size: int | None
) -> None:

    torch.manual_seed(0)
    layer = HyperDense(in_f, out_f, ensemble_size)
    assert layer.linear.bias is None
    _unit_rows(layer.linear.weight)
    _train(layer, in_f, 4)
    _unit_rows(layer.linear.weight)
    if ensemble_size is not None:
        assert not torch.allclose(layer.linear.weight[0], layer.linear.weight[1])


def test_hyperdense_rows_leave_sphere_without_projection() -> None:
    """Guards the test above: an optimiser step alone does move rows off the unit sphere."""
    torch.manual_seed(1)
    layer = HyperDense(8, 16, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=5e-2)
    layer(torch.randn(32, 8)).square().mean().backward()
    opt.step()
    norms = torch.linalg.vector_norm(layer.linear.weight, dim=-1)
    assert (norms - 1).abs().max() > 1e-3
    project_weights_(layer)
    _unit_rows(layer.linear.weight)


SUPPORTED_LORA_WN = [("paper", "project"), ("paper", "forward"), ("zero_b", "forward")]


@pytest.mark.parametrize(("init", "weight_norm"), SUPPORTED_LORA_WN)
def test_lora_hyperdense_effective_rows_unit(weight_norm: str, init: str) -> None:
    torch.manual_seed(2)
    layer = HyperDense(24, 16, 2, lora={**LORA, "weight_norm": weight_norm, "init": init})
    assert layer.is_lora
    assert set(dict(layer.named_parameters())) == {"linear.lora_A", "linear.lora_B"}
    _unit_rows(layer.effective_weight())
    base0 = layer.linear.base_weight.clone()
    for _ in range(3):
        _train(layer, 24, 2)
        _unit_rows(layer.effective_weight())
    assert torch.equal(layer.linear.base_weight, base0)


@pytest.mark.parametrize(("init", "weight_norm"), SUPPORTED_LORA_WN)
def test_lora_hyperdense_100_steps_bounded_and_unit(init: str, weight_norm: str) -> None:
    """Issue 10: after 100 AdamW steps (large lr) on a 64→256 layer every effective row is unit
    within 1e-5, no row is left on the fallback path, and the adapters stay bounded."""
    torch.manual_seed(21)
    lora = {**LORA, "rank": 16, "alpha": 16.0, "init": init, "weight_norm": weight_norm}
    layer = HyperDense(64, 256, 2, lora=lora)
    inner = layer.linear
    scale0 = max(inner.lora_A.norm().item(), inner.lora_B.norm().item())
    opt = torch.optim.AdamW([p for p in layer.parameters() if p.requires_grad], lr=3e-2)
    for step in range(100):
        x = l2_normalize(torch.randn(32, 64))
        loss = (layer(x) - 0.3).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        project_weights_(layer)
        if step % 10 == 9:
            _unit_rows(layer.effective_weight())
    assert not inner.fallback_rows.any()
    for p in (inner.lora_A, inner.lora_B):
        assert torch.isfinite(p).all() and p.norm() < 10 * scale0
    if weight_norm == "project":  # ‖c·Δw‖ ≤ ‖w0 + c·Δw‖ + ‖w0‖ = 1 + √κ on every row
        bound = 1 + math.sqrt(LORA["kernel_init_scale"]) + 1e-5
        assert torch.linalg.vector_norm(inner.delta_weight(), dim=-1).max() <= bound


def test_lora_hyperdense_zero_b_with_projection_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"critic\.lora_init=zero_b.*critic\.weight_norm=forward"):
        HyperDense(64, 256, 2, lora={**LORA, "init": "zero_b", "weight_norm": "project"})


def _dense_w(layer: HyperDense) -> torch.Tensor:
    return layer.effective_weight().detach()


def test_embedder_matches_formula() -> None:
    torch.manual_seed(3)
    emb = SimbaV2Embedder(5, 16, c_shift=3.0, ensemble_size=2)
    x = torch.randn(7, 5)
    xs = torch.cat([x, torch.full((7, 1), 3.0)], dim=-1)
    xs = xs / xs.norm(dim=-1, keepdim=True)
    h = torch.einsum("bi,eoi->ebo", xs, _dense_w(emb.dense)) * math.sqrt(2 / 16)
    ref = h / h.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(emb(x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(emb.scaler.effective(), torch.full((2, 1, 16), math.sqrt(2 / 16)))


def test_lerp_block_matches_formula() -> None:
    torch.manual_seed(4)
    h, blocks = 8, 3
    block = LerpBlock(h, blocks, ensemble_size=2)
    x = l2_normalize(torch.randn(2, 5, h))
    s = math.sqrt(2 / h) / 2
    z = torch.relu(s * torch.einsum("ebi,eoi->ebo", x, _dense_w(block.w1))) + 1e-8
    m = torch.einsum("ebi,eoi->ebo", z, _dense_w(block.w2))
    m = m / m.norm(dim=-1, keepdim=True)
    y = x + (1 / (blocks + 1)) * (m - x)
    ref = y / y.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(block(x), ref, atol=1e-5, rtol=1e-5)
    assert block.w1.out_features == 4 * h and block.w2.in_features == 4 * h
    assert block.alpha.scale == pytest.approx(1 / math.sqrt(h))
    assert block.s.init == pytest.approx(s) and block.s.scale == pytest.approx(s)


@pytest.mark.parametrize("ensemble_size", [None, 2])
def test_head_matches_official_structure(ensemble_size: int | None) -> None:
    """Issue 10: HyperDense(h→h) → Scaler(h, 1, 1) → unit-row HyperDense(h→out) + zero-init bias,
    the output rows projected at init and after every step (official SimbaV2 value/policy heads)."""
    torch.manual_seed(5)
    head = SimbaV2Head(8, 11, ensemble_size=ensemble_size)
    assert isinstance(head.out, HyperDense) and not head.out.is_lora
    assert head.out.linear.bias is None
    lead = () if ensemble_size is None else (2, 1)
    assert head.bias.shape == (*lead, 11) and torch.count_nonzero(head.bias) == 0
    assert head.scaler.init == 1.0 and head.scaler.scale == 1.0
    _unit_rows(head.out.effective_weight())
    _train(head, 8, 3)
    _unit_rows(head.out.effective_weight())
    _unit_rows(head.dense.effective_weight())
    assert torch.count_nonzero(head.bias) > 0  # the bias trains
    x = l2_normalize(torch.randn(2, 4, 8))
    eq = "ebi,oi->ebo" if ensemble_size is None else "ebi,eoi->ebo"
    feat = torch.einsum(eq, x, _dense_w(head.dense)) * head.scaler.effective()
    ref = torch.einsum(eq, feat, _dense_w(head.out)) + head.bias
    y = head(x)
    torch.testing.assert_close(y, ref.expand_as(y), atol=1e-5, rtol=1e-5)


def test_lora_head_adapts_the_hidden_layer_only() -> None:
    head = SimbaV2Head(16, 11, ensemble_size=2, lora=LORA)
    assert head.dense.is_lora and not head.out.is_lora


@pytest.mark.parametrize("lora", [None, LORA])
def test_encoder_finite_and_unit_on_extreme_inputs(lora: dict | None) -> None:
    torch.manual_seed(6)
    enc = SimbaV2Encoder(6, 16, num_blocks=2, ensemble_size=2, lora_embedder=lora, lora_blocks=lora)
    x = torch.stack(
        [
            torch.full((6,), 1e6),
            torch.full((6,), -1e6),
            torch.zeros(6),
            torch.tensor([1e6, -1e6, 0.0, 1e-6, 3.0, -1e30]),
        ]
    ).requires_grad_()
    y = enc(x)
    assert y.shape == (2, 4, 16)
    assert torch.isfinite(y).all()
    _unit_rows(y)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_encoder_accepts_per_member_batches() -> None:
    torch.manual_seed(7)
    enc = SimbaV2Encoder(6, 16, num_blocks=1, ensemble_size=2)
    x = torch.randn(2, 3, 6)
    y = enc(x)
    for m in range(2):
        torch.testing.assert_close(y[m], enc(x[m])[m], atol=1e-6, rtol=1e-6)


def test_l2_normalize_zero_vector_is_finite() -> None:
    x = torch.zeros(3, 4, requires_grad=True)
    y = l2_normalize(x)
    assert torch.equal(y, torch.zeros(3, 4))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    v = torch.randn(5, 7)
    torch.testing.assert_close(l2_normalize(v), v / v.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(F.normalize(v, dim=0), l2_normalize(v, dim=0))
