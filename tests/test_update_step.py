"""UpdateStep and verify_compile: eager/compiled parity, tensor-only metrics, mismatch detection.

The real parity check compiles with inductor (a C++ compiler on CPU; ~60-70 s per learner on a cold
cache on 2 cores), so the default run compiles two learners with inductor (FastTD3 + SimbaV2-LoRA,
FastSAC + MLP) and checks the other families through dynamo + AOTAutograd (`aot_eager`, no code
generation). FAST_LORA_TD3_ALL_COMPILE=1 runs inductor for every algorithm × family.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings
from types import SimpleNamespace

import pytest
import torch
from learner_helpers import bandit_batch, make

import fast_lora_td3.training.update_step as us
from fast_lora_td3.config.schema import parse_flag
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.training.compile_setup import make_capturable_
from fast_lora_td3.training.update_mode import mode_candidates, select_mode
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig, verify_compile

EAGER = UpdateStepConfig(compile=False, cuda_graph=False)
AOT_EAGER = UpdateStepConfig(compile=True, compile_backend="aot_eager")

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
    step = UpdateStep(learner, dataclasses.replace(EAGER, policy_frequency=2))
    assert step.mode == "eager"
    for i in range(3):
        metrics = step(batches())
        assert metrics and all(
            isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values()
        )
        assert ("actor_loss" in metrics) == (i % 2 == 1)
    assert step.num_critic_updates == 3


def test_cuda_graph_on_cpu_falls_back_with_one_line_note(capsys: pytest.CaptureFixture) -> None:
    step = UpdateStep(make(), UpdateStepConfig(compile=False, cuda_graph=True))
    assert step.mode == "eager"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda_graph" in err[0]


def test_bad_graph_impl_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="graph_impl"):
        UpdateStepConfig(cuda_graph=True, graph_impl="magic")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"compile": "maybe"}, "compile='maybe'"), ({"cuda_graph": 2}, "cuda_graph=2"),
     ({"policy_frequency": 0}, "policy_frequency=0")],
)  # fmt: skip
def test_update_step_config_rejects_bad_values_with_one_line_config_error(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        UpdateStepConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_update_step_config_normalises_flags_and_is_built_from_the_train_config() -> None:
    from fast_lora_td3.config.compose import compose_config

    assert UpdateStepConfig(compile=True, cuda_graph="False").compile == "true"
    assert UpdateStepConfig(compile=True, cuda_graph="False").cuda_graph == "false"
    cfg = compose_config(["compile=false", "cuda_graph=auto", "algo.policy_frequency=3"])
    config = UpdateStepConfig.from_train_config(cfg)
    assert (config.compile, config.cuda_graph, config.policy_frequency) == ("false", "auto", 3)
    assert (config.graph_impl, config.compile_backend) == ("manual", "inductor")


@pytest.mark.parametrize("policy_frequency", [1, 3])
def test_actor_updates_every_policy_frequency_th_call_and_resume_keeps_the_schedule(
    policy_frequency: int,
) -> None:
    """The schedule counts over the run: a step rebuilt from a checkpointed count (as a resumed
    trainer rebuilds it) continues it exactly, and the learner + step state round-trips."""
    torch.manual_seed(7)
    learner = make("fastsac", "mlp")
    config = dataclasses.replace(EAGER, policy_frequency=policy_frequency)
    step = UpdateStep(learner, config)
    actor_calls = [i for i in range(1, 6) if "actor_loss" in step(batches())]
    assert actor_calls == [i for i in range(1, 6) if i % policy_frequency == 0]
    state = {**learner.state_dict(), **step.state_dict()}
    assert state["num_critic_updates"] == 5  # the checkpoint key every saved run has
    assert "num_critic_updates" not in learner.state_dict()  # counted by the step only
    resumed_learner = make("fastsac", "mlp")
    resumed_learner.load_state_dict(state)
    resumed = UpdateStep(resumed_learner, config)
    resumed.load_state_dict(state)
    later = [i for i in range(6, 10) if "actor_loss" in resumed(batches())]
    assert later == [i for i in range(6, 10) if i % policy_frequency == 0]
    assert resumed.num_critic_updates == 9


def test_optimizers_and_state_tensors_cover_fastsac_alpha() -> None:
    """Everything an update changes is listed by the learner itself (UpdateStep restores these
    after a CUDA-graph warm-up): FastSAC's log α and its optimiser included."""
    learner = make("fastsac", "mlp")
    assert list(learner.optimizers()) == ["critic_optimizer", "actor_optimizer", "alpha_optimizer"]
    assert "alpha_optimizer" not in make("fasttd3", "mlp").optimizers()
    UpdateStep(learner)(batches())  # creates the optimiser state
    names = dict(learner.state_tensors())
    assert names["log_alpha"] is learner.log_alpha
    alpha_state = learner.alpha_optimizer.state[learner.log_alpha]
    assert any(t is alpha_state["exp_avg"] for t in names.values())
    params = {id(t) for t in names.values()}
    assert all(id(p) in params for p in learner.critic.parameters())
    assert all(id(p) in params for p in learner.actor.parameters())


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "family"), INDUCTOR_CASES)
def test_inductor_compiled_update_matches_eager(algo: str, family: str) -> None:
    torch.manual_seed(1)
    learner = make(algo, family)
    before = _compiled_frames()
    result = verify_compile(learner, batches, UpdateStepConfig(compile=True), steps=3)
    assert _compiled_frames() > before, "dynamo compiled nothing: the check would be vacuous"
    assert result["verified"] and result["mode"] == "compiled"
    assert result["max_metric_diff"] <= 1e-4 and result["max_update_rel_err"] <= 1e-2


@pytest.mark.parametrize("family", ["simbav2", "mlp_lora"])
def test_aot_eager_compiled_update_matches_eager_and_returns_tensors(family: str) -> None:
    torch.manual_seed(2)
    learner = make("fasttd3", family)
    result = verify_compile(learner, batches, AOT_EAGER, steps=2)
    assert result["verified"] and result["max_update_rel_err"] <= 1e-3
    step = UpdateStep(learner, AOT_EAGER)
    metrics = step(batches())
    assert "actor_loss" in metrics
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
    result = verify_compile(learner, batches, UpdateStepConfig(compile=True), steps=3)
    assert result["verified"]
    assert result["max_metric_diff"] == 0.0 and result["max_update_rel_err"] == 0.0
    assert torch.equal(torch.get_rng_state(), state)
    after = learner.critic.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_verify_compile_detects_parameter_noise(monkeypatch) -> None:
    def noisy(learner) -> None:
        with torch.no_grad():
            for p in learner.critic_params:
                p.add_(torch.randn_like(p) * 1e-2)

    monkeypatch.setattr(us.torch, "compile", _fake_compile(after=noisy))
    learner = make("fasttd3", "mlp")
    with pytest.raises(RuntimeError, match=r"differs from eager: .* > (tolerance|atol)"):
        verify_compile(learner, batches, UpdateStepConfig(compile=True), steps=3)


def test_verify_compile_detects_metric_mismatch(monkeypatch) -> None:
    monkeypatch.setattr(us.torch, "compile", _fake_compile(scale_metric="critic_loss"))
    learner = make("fasttd3", "mlp")
    with pytest.raises(RuntimeError, match=r"critic_loss.* > atol 0\.0001 \+ rtol 0\.001"):
        verify_compile(learner, batches, UpdateStepConfig(compile=True), steps=2)


def test_tolerance_row_is_tf32_only_for_fp32_on_cuda_with_tf32(monkeypatch) -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert us.tolerance_precision(False, cuda) == "tf32"
    assert us.tolerance_precision(False, cpu) == "fp32"
    assert us.tolerance_precision(True, cuda) == "bf16"
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert us.tolerance_precision(False, cuda) == "fp32"
    # TF32 admits more than fp32 (measured on an H200) and less than bf16; a broken step moves ~100 %
    assert us._TOLERANCES["fp32"][2] < us._TOLERANCES["tf32"][2] < us._TOLERANCES["bf16"][2] < 1


def test_verify_compile_skips_when_nothing_is_compiled() -> None:
    result = verify_compile(make(), batches, EAGER)
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


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


@pytest.mark.parametrize("algo", ["fasttd3", "fastsac"])
def test_compiled_steps_under_cosine_schedule_do_not_recompile(algo: str) -> None:
    """Issue 10, defect 3: a Python-float LR changed by the scheduler every step recompiled the
    optimiser step each time (until the recompile limit fell back to eager)."""
    from learner_helpers import ACT, OBS, small_actor, small_critic

    from fast_lora_td3.algos import AlgoConfig, make_learner

    torch.manual_seed(4)
    algo_cfg = AlgoConfig(name=algo, num_atoms=51, v_min=-5.0, v_max=5.0, lr_min=1e-5)
    learner = make_learner(
        algo_cfg, small_critic("mlp"), small_actor(), OBS, OBS, ACT, "cpu", total_iterations=50
    )
    assert learner.schedulers
    torch._dynamo.reset()
    step = UpdateStep(learner, dataclasses.replace(AOT_EAGER, policy_frequency=2))
    lrs = []
    for _ in range(2):  # the first critic and the first actor update compile their graphs
        step(batches())
        learner.step_schedulers()
    graphs = _unique_graphs()
    assert graphs > 0, "dynamo compiled nothing: the check would be vacuous"
    for _ in range(6):
        step(batches())
        learner.step_schedulers()
        lrs.append(float(learner.critic_optimizer.param_groups[0]["lr"]))
    assert _unique_graphs() == graphs, "a learning-rate change recompiled the update"
    assert all(b < a for a, b in itertools.pairwise(lrs)), lrs  # the schedule did move the LR
    for opt in learner.optimizers().values():
        assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)


def test_fused_adamw_matches_foreach_adamw() -> None:
    """make_adamw picks the fused kernel on CPU too: same math as the `foreach` one."""
    from fast_lora_td3.algos.common import make_adamw

    torch.manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(7, 5)) for _ in range(3)]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fused = make_adamw(
        [{"params": params, "weight_decay": 0.1}], 1e-2, (0.9, 0.95), torch.device("cpu")
    )
    ref = torch.optim.AdamW(
        [{"params": copies, "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.95), foreach=True
    )
    assert fused.param_groups[0]["fused"]
    for _ in range(5):
        grads = [torch.randn_like(p) for p in params]
        for p, q, g in zip(params, copies, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        ref.step()
    for p, q in zip(params, copies, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_loading_a_checkpoint_keeps_the_tensor_lr_a_compiled_step_reads() -> None:
    torch.manual_seed(6)
    saved = make("fasttd3", "mlp", lr_min=1e-5)  # float LRs (an eager run's checkpoint)
    saved.critic_optimizer.param_groups[0]["lr"] = 2e-4
    learner = make("fasttd3", "mlp")
    UpdateStep(learner, AOT_EAGER)
    lr = learner.critic_optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor)
    learner.load_state_dict(saved.state_dict())
    group = learner.critic_optimizer.param_groups[0]
    assert group["lr"] is lr and float(lr) == pytest.approx(2e-4)
    assert group["fused"]


# -- the automatic mode choice (issue 10: the fast path by default) ---------------------------
CUDA = torch.device("cuda")  # mode_candidates only reads device.type: no GPU is needed


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "auto"), ("auto", "auto"), (True, "true"), (False, "false"), ("False", "false"),
     ("TRUE", "true"), ("0", "false")],
)  # fmt: skip
def test_parse_flag_takes_bools_and_hydra_strings(value, expected) -> None:
    assert parse_flag("compile", value) == expected


def test_parse_flag_rejects_other_values_with_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"compile='maybe' is not valid: use compile=auto"):
        parse_flag("compile", "maybe")


@pytest.mark.parametrize(
    ("compile_", "graph", "names"),
    [
        ("auto", "auto", ["graphed", "compiled", "eager"]),
        ("auto", "false", ["compiled", "eager"]),
        ("false", "auto", ["graphed_eager", "eager"]),
        ("false", "false", ["eager"]),
        ("true", "auto", ["graphed", "compiled"]),
        ("auto", "true", ["graphed", "graphed_eager"]),
        ("true", "false", ["compiled"]),
    ],
)
def test_cuda_candidates_fastest_first_and_explicit_false_wins(compile_, graph, names) -> None:
    candidates, why = mode_candidates(compile_, graph, CUDA)
    assert [m.name for m in candidates] == names
    assert f"compile={compile_}" in why and f"cuda_graph={graph}" in why


def test_no_graph_candidates_with_data_parallel_sync() -> None:
    candidates, why = mode_candidates("auto", "auto", CUDA, can_graph=False)
    assert [m.name for m in candidates] == ["compiled", "eager"] and "data-parallel" in why


def test_cpu_auto_is_eager_and_explicit_true_still_compiles() -> None:
    cpu = torch.device("cpu")
    assert [m.name for m in mode_candidates("auto", "auto", cpu)[0]] == ["eager"]
    assert [m.name for m in mode_candidates("true", "auto", cpu)[0]] == ["compiled"]


def _verifier(failing: set[str]):
    calls = []

    def verify(mode):
        calls.append(mode.name)
        if mode.name in failing:
            raise RuntimeError(f"verify_compile: {mode.name} update differs from eager: boom\nmore")
        return {"verified": True, "max_update_rel_err": 1e-7}

    return verify, calls


@pytest.mark.parametrize(
    ("failing", "chosen"),
    [(set(), "graphed"), ({"graphed"}, "compiled"), ({"graphed", "compiled"}, "eager")],
)
def test_selection_falls_back_graphed_compiled_eager_with_one_line(failing, chosen) -> None:
    candidates, why = mode_candidates("auto", "auto", CUDA)
    verify, calls = _verifier(failing)
    mode, line = select_mode(candidates, verify, why, auto=True)
    assert mode.name == chosen
    assert calls == [m.name for m in candidates if m.name != "eager"][: len(failing) + 1]
    assert "\n" not in line and line.startswith(f"update step: {chosen} (on cuda")
    for name in failing:
        assert f"{name} failed: RuntimeError: verify_compile: {name} update differs" in line
    if chosen != "eager":
        assert "passed the parity check" in line


def test_selection_without_eager_raises_when_every_mode_fails() -> None:
    candidates, why = mode_candidates("true", "auto", CUDA)
    verify, _ = _verifier({"graphed", "compiled"})
    with pytest.raises(RuntimeError, match="no update mode passed"):
        select_mode(candidates, verify, why, auto=True)


def test_update_step_auto_on_cpu_is_eager_with_one_line(capsys) -> None:
    step = UpdateStep(make(), UpdateStepConfig(compile="auto", cuda_graph="auto"))
    assert step.mode == "eager"
    out = capsys.readouterr().err.strip().splitlines()
    assert out == [step.selection]
    assert out[0].startswith("update step: eager (on cpu") and "compile=auto means eager" in out[0]


@pytest.mark.parametrize("broken", [False, True])
def test_update_step_auto_chooses_at_first_batch_and_falls_back_on_parity_failure(
    monkeypatch, capsys, broken: bool
) -> None:
    """The real pending path: candidates (compiled, eager) as on a CUDA machine with
    cuda_graph=false; a compiler that corrupts the update fails the check and eager is used."""
    from fast_lora_td3.training.update_mode import ModeFlags

    def candidates(*_a, **_k):
        return [ModeFlags(True, False), ModeFlags(False, False)], "on cuda with compile=auto"

    def noisy(learner) -> None:
        with torch.no_grad():
            for p in learner.critic_params:
                p.add_(torch.randn_like(p) * 1e-2)

    monkeypatch.setattr(us, "mode_candidates", candidates)
    monkeypatch.setattr(us.torch, "compile", _fake_compile(after=noisy if broken else None))
    learner = make("fasttd3", "mlp")
    config = UpdateStepConfig(compile="auto", cuda_graph="false", policy_frequency=2)
    step = UpdateStep(learner, config)
    assert step.mode == "pending" and capsys.readouterr().err == ""
    metrics = step(batches())
    assert "critic_loss" in metrics and "actor_loss" not in metrics
    assert step.num_critic_updates == 1
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1
    if broken:
        assert step.mode == "eager" and not step.verified
        assert (
            out[0].startswith("update step: eager (") and "compiled failed: RuntimeError" in out[0]
        )
    else:
        assert step.mode == "compiled" and step.verified
        assert out[0].startswith("update step: compiled (") and "passed the parity check" in out[0]


def test_train_config_defaults_to_auto_and_hydra_false_is_explicit() -> None:
    from fast_lora_td3.config.compose import compose_config

    cfg = compose_config([])
    assert (cfg.compile, cfg.cuda_graph) == ("auto", "auto")
    cfg = compose_config(["compile=false", "cuda_graph=true"])
    assert parse_flag("compile", cfg.compile) == "false"
    assert parse_flag("cuda_graph", cfg.cuda_graph) == "true"
    preset = compose_config(["experiment=g1_flat_fasttd3_lora"])
    assert (preset.compile, preset.cuda_graph) == ("auto", "auto")
