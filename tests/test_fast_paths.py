"""Issue 10's faster update step changes speed only: the fused l2_normalize backward, the LoRA
low-rank backward and fused AdamW against the straightforward implementations they replace
(`bench.implementation("reference")`, which `bench update impls=fast,reference` times)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from learner_helpers import bandit_batch, make

from fast_lora_td3.bench import implementation
from fast_lora_td3.nn.layers import l2_normalize
from fast_lora_td3.nn.lora import LoRALinear
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig


@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 6)])
def test_l2_normalize_values_equal_f_normalize_and_gradients_match(shape: tuple) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        x[0, 0] = 1e-10  # a row shorter than eps: divided by eps, no normal-direction term
    y, ref = l2_normalize(x), F.normalize(x, dim=-1, eps=1e-8)
    assert torch.equal(y, ref)
    grad_out = torch.randn_like(y)
    got = torch.autograd.grad(y, x, grad_out)[0]
    want = torch.autograd.grad(ref, x, grad_out)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    x2 = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(l2_normalize, (x2,))


def _grads(learner, batch) -> dict[str, torch.Tensor]:
    """Critic and actor loss gradients (Adam is scale-invariant: compare gradients directly)."""
    out = {}
    for name, loss_fn, module in (
        ("critic", learner.critic_loss, learner.critic),
        ("actor", learner.actor_loss, learner.actor),
    ):
        module.zero_grad(set_to_none=True)
        torch.manual_seed(9)
        loss_fn(batch)[0].backward()
        for n, p in module.named_parameters():
            if p.grad is not None:
                out[f"{name}.{n}"] = p.grad.detach().clone()
        module.zero_grad(set_to_none=True)
    return out


def _run(algo: str, family: str, steps: int = 4) -> tuple[list[dict], dict, dict, dict]:
    torch.manual_seed(7)
    learner = make(algo, family)
    torch.manual_seed(10)
    grads = _grads(learner, bandit_batch(64, bootstrap=1.0))
    start = {n: t.detach().clone() for n, t in learner.state_tensors()}
    step = UpdateStep(learner, UpdateStepConfig(policy_frequency=2))
    history = []
    torch.manual_seed(8)
    for _ in range(steps):
        out = step(bandit_batch(64, bootstrap=1.0))
        history.append({k: float(v) for k, v in out.items()})
    end = {n: t.detach().clone() for n, t in learner.state_tensors() if n in start}
    return history, start, end, grads


@pytest.mark.parametrize(
    ("algo", "family"),
    [("fasttd3", "simbav2_lora"), ("fasttd3", "simbav2"), ("fastsac", "simbav2_lora")],
)
def test_fast_update_matches_reference_implementations(
    monkeypatch: pytest.MonkeyPatch, algo: str, family: str
) -> None:
    fast = _run(algo, family)
    with implementation("reference"):
        ref = _run(algo, family)
    for got, want in zip(fast[0], ref[0], strict=True):
        assert got.keys() == want.keys()
        for key in got:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key
    assert fast[3].keys() == ref[3].keys() and any("lora" in n for n in ref[3]) == family.endswith(
        "lora"
    )
    for name, want in ref[3].items():
        torch.testing.assert_close(fast[3][name], want, rtol=1e-4, atol=1e-6, msg=name)
    start = ref[1]
    for name, want in ref[2].items():
        if not want.is_floating_point():
            assert torch.equal(fast[2][name], want), name
            continue
        moved = (want.double() - start[name].double()).norm()
        diff = (fast[2][name].double() - want.double()).norm()
        assert diff <= 1e-3 * moved + 1e-6, (name, float(diff), float(moved))


def test_reference_paths_are_really_different_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard against a vacuous comparison: the monkeypatches reach the code the learner runs."""
    calls = []
    with implementation("reference"), monkeypatch.context() as m:
        m.setattr(LoRALinear, "effective_weight", _counting(LoRALinear.effective_weight, calls))
        learner = make("fasttd3", "simbav2_lora")
        assert not learner.critic_optimizer.param_groups[0].get("fused")
        calls.clear()
        learner.critic(torch.randn(3, 6), torch.randn(3, 2))
    assert calls
    learner = copy.deepcopy(make("fasttd3", "simbav2_lora"))  # restored after the context
    assert learner.critic_optimizer.param_groups[0]["fused"]
    calls.clear()
    x = torch.randn(3, 8, requires_grad=True)
    assert l2_normalize(x).grad_fn.name().endswith("_L2NormalizeBackward")


def _counting(fn, calls: list):
    def wrapped(self):
        calls.append(1)
        return fn(self)

    return wrapped
