"""UpdateStep and verify_compile: eager/compiled parity, tensor-only metrics, mismatch detection.

The real parity check compiles with inductor (a C++ compiler on CPU; ~60-70 s per learner on a cold
cache on 2 cores), so the default run compiles two learners with inductor (FastTD3 + SimbaV2-LoRA,
FastSAC + MLP) and checks the other families through dynamo + AOTAutograd (`aot_eager`, no code
generation). FAST_LORA_TD3_ALL_COMPILE=1 runs inductor for every algorithm × family.
"""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace

import pytest
import torch
from test_algos import bandit_batch, make

import fast_lora_td3.update_step as us
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.update_step import UpdateStep, make_capturable_, verify_compile

FAMILIES = ("mlp", "simbav2", "simbav2_lora", "mlp_lora")
ALL = os.environ.get("FAST_LORA_TD3_ALL_COMPILE") == "1"
INDUCTOR_CASES = (
    [(a, f) for a in ("fasttd3", "fastsac") for f in FAMILIES]
    if ALL
    else [("fasttd3", "simbav2_lora"), ("fastsac", "mlp")]
)


def batches() -> SimpleNamespace:
    """A bootstrapping batch, so the target network and the actor take part in the loss."""
    return bandit_batch(64, bootstrap=1.0)


def _compiled_frames() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["stats"].values())) + int(counters["frames"].get("ok", 0))


@pytest.mark.parametrize("algo", ["fasttd3", "fastsac"])
def test_eager_step_returns_device_tensors_and_counts_updates(algo: str) -> None:
    torch.manual_seed(0)
    learner = make(algo, "simbav2_lora")
    step = UpdateStep(learner, SimpleNamespace(compile=False, cuda_graph=False))
    assert step.mode == "eager"
    for i in range(3):
        metrics = step(batches(), do_actor=i % 2 == 1)
        assert metrics and all(
            isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values()
        )
        assert ("actor_loss" in metrics) == (i % 2 == 1)
    assert learner.num_critic_updates == 3


def test_cuda_graph_on_cpu_falls_back_with_one_line_note(capsys: pytest.CaptureFixture) -> None:
    step = UpdateStep(make(), SimpleNamespace(compile=False, cuda_graph=True))
    assert step.mode == "eager"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda_graph" in err[0]


def test_bad_graph_impl_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="graph_impl"):
        UpdateStep(make(), SimpleNamespace(cuda_graph=True, graph_impl="magic"))


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "family"), INDUCTOR_CASES)
def test_inductor_compiled_update_matches_eager(algo: str, family: str) -> None:
    torch.manual_seed(1)
    learner = make(algo, family)
    before = _compiled_frames()
    result = verify_compile(learner, batches, SimpleNamespace(compile=True), steps=3)
    assert _compiled_frames() > before, "dynamo compiled nothing: the check would be vacuous"
    assert result["verified"] and result["mode"] == "compiled"
    assert result["max_metric_diff"] <= 1e-4 and result["max_update_rel_err"] <= 1e-2


@pytest.mark.parametrize("family", ["simbav2", "mlp_lora"])
def test_aot_eager_compiled_update_matches_eager_and_returns_tensors(family: str) -> None:
    torch.manual_seed(2)
    learner = make("fasttd3", family)
    cfg = SimpleNamespace(compile=True, compile_backend="aot_eager")
    result = verify_compile(learner, batches, cfg, steps=2)
    assert result["verified"] and result["max_update_rel_err"] <= 1e-3
    step = UpdateStep(learner, cfg)
    metrics = step(batches(), do_actor=True)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())


def _fake_compile(after=None, scale_metric: str | None = None):
    """A stand-in for torch.compile: runs the eager function, then optionally corrupts the result."""

    def compile_(fn, **_kw):
        def wrapped(batch):
            out = fn(batch)
            if after is not None:
                after(fn.__self__)
            if scale_metric in out:
                out = {**out, scale_metric: out[scale_metric] * 1.1}
            return out

        return wrapped

    return compile_


def test_verify_compile_passes_when_equal_and_leaves_learner_and_rng_alone(monkeypatch) -> None:
    monkeypatch.setattr(us.torch, "compile", _fake_compile())
    torch.manual_seed(3)
    learner = make("fastsac", "simbav2_lora")
    before = {k: v.clone() for k, v in learner.critic.state_dict().items()}
    state = torch.get_rng_state()
    result = verify_compile(learner, batches, SimpleNamespace(compile=True), steps=3)
    assert result["verified"]
    assert result["max_metric_diff"] == 0.0 and result["max_update_rel_err"] == 0.0
    assert torch.equal(torch.get_rng_state(), state)
    after = learner.critic.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert learner.num_critic_updates == 0


def test_verify_compile_detects_parameter_noise(monkeypatch) -> None:
    def noisy(learner) -> None:
        with torch.no_grad():
            for p in learner.critic_params:
                p.add_(torch.randn_like(p) * 1e-2)

    monkeypatch.setattr(us.torch, "compile", _fake_compile(after=noisy))
    learner = make("fasttd3", "mlp")
    with pytest.raises(RuntimeError, match=r"differs from eager: .* > (tolerance|atol)"):
        verify_compile(learner, batches, SimpleNamespace(compile=True), steps=3)


def test_verify_compile_detects_metric_mismatch(monkeypatch) -> None:
    monkeypatch.setattr(us.torch, "compile", _fake_compile(scale_metric="critic_loss"))
    learner = make("fasttd3", "mlp")
    with pytest.raises(RuntimeError, match=r"critic_loss.* > atol 0\.0001 \+ rtol 0\.001"):
        verify_compile(learner, batches, SimpleNamespace(compile=True), steps=2)


def test_verify_compile_skips_when_nothing_is_compiled() -> None:
    result = verify_compile(make(), batches, SimpleNamespace(compile=False, cuda_graph=False))
    assert result["verified"] is False and result["mode"] == "eager"


def test_make_capturable_gives_tensor_lr_that_schedulers_update_in_place() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    p.grad = torch.ones(3)
    opt.step()  # creates state (step on the host, as for a non-capturable AdamW)
    make_capturable_(opt, torch.device("cpu"))
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and opt.param_groups[0]["capturable"]
    assert opt.state[p]["step"].dtype == torch.float32
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=1e-4)
    with warnings.catch_warnings():  # "scheduler before optimizer step": irrelevant here
        warnings.simplefilter("ignore", UserWarning)
        sched.step()
    assert opt.param_groups[0]["lr"] is lr  # the tensor a captured graph reads
    expected = 1e-4 + (1e-3 - 1e-4) * (1 + torch.cos(torch.tensor(torch.pi / 10))) / 2
    assert torch.allclose(lr, expected.to(lr.dtype), rtol=1e-5)
