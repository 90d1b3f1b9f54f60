"""FastTD3 / FastSAC update rules: CDQ selection, LoRA targets, param groups, learning sanity."""

from __future__ import annotations

import warnings

import pytest
import torch
from learner_helpers import ACT, OBS, bandit_batch, make, small_critic

from fast_lora_td3.algos import AlgoConfig, FastSACLearner, make_learner
from fast_lora_td3.algos.common import PolyakUpdater, make_target, param_groups
from fast_lora_td3.algos.fasttd3 import select_cdq_target
from fast_lora_td3.nn import ActorConfig, C51Support, LoRALinear
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig


def test_cdq_picks_member_with_smaller_mean() -> None:
    torch.manual_seed(0)
    support = C51Support(-5.0, 5.0, 21)
    projected = torch.softmax(torch.randn(2, 64, 21) * 3, dim=-1)
    chosen = select_cdq_target(projected, support)
    means = (projected * torch.linspace(-5, 5, 21)).sum(-1)
    for i in range(64):
        expected = projected[0, i] if means[0, i] <= means[1, i] else projected[1, i]
        torch.testing.assert_close(chosen[i], expected)


def test_td3_target_is_shared_min_member() -> None:
    torch.manual_seed(1)
    learner = make("fasttd3", "mlp")
    batch = bandit_batch(32, bootstrap=1.0)
    target = learner.target_distribution(batch)
    assert target.shape == (2, 32, 51)
    torch.testing.assert_close(target[0], target[1])
    torch.testing.assert_close(target.sum(-1), torch.ones(2, 32))


@pytest.mark.parametrize("family", ["mlp", "simbav2", "simbav2_lora"])
@pytest.mark.parametrize("algo", ["fasttd3", "fastsac"])
def test_learning_sanity_td_error_drops(algo: str, family: str) -> None:
    """A few hundred updates (an actor update every second one) on a task with known Q* cut the
    TD error substantially."""
    torch.manual_seed(2)
    learner = make(algo, family, critic_lr=1e-3, weight_decay=0.0, alpha_init=1e-4)
    eval_batch = bandit_batch(512)

    def td_error() -> float:
        with torch.no_grad():
            cobs = learner.norm_critic_obs(eval_batch.critic_obs)
            q = learner.q_values(learner.critic(cobs, eval_batch.actions))
            return (q - eval_batch.rewards).abs().mean().item()

    before = td_error()
    step = UpdateStep(learner, UpdateStepConfig(policy_frequency=2))
    for _ in range(300):
        step(bandit_batch(256))
    assert step.num_critic_updates == 300
    after = td_error()
    assert after < 0.35 * before, (before, after)


def test_actor_update_leaves_critic_without_grads() -> None:
    learner = make("fasttd3", "simbav2_lora")
    learner.critic.zero_grad(set_to_none=True)
    loss, _ = learner.actor_loss(bandit_batch(16))
    loss.backward()
    assert all(p.grad is None for p in learner.critic.parameters())
    assert any(p.grad is not None for p in learner.actor.parameters())


@pytest.mark.parametrize("family", ["simbav2_lora", "mlp_lora"])
def test_polyak_on_lora_targets_mixes_effective_weights(family: str) -> None:
    torch.manual_seed(3)
    learner = make("fasttd3", family)
    online, target = learner.critic, learner.critic_target
    for i in range(3):  # move the online net away from the target
        learner.critic_update(bandit_batch(64, bootstrap=float(i % 2)))
    lora_online = [m for m in online.modules() if isinstance(m, LoRALinear)]
    lora_target = [m for m in target.modules() if isinstance(m, LoRALinear)]
    assert lora_online
    before_t = [m.effective_weight().clone() for m in lora_target]
    now_o = [m.effective_weight().clone() for m in lora_online]
    dense_o = {n: p.clone() for n, p in online.named_parameters() if "lora_" not in n}
    dense_t = {n: p.clone() for n, p in target.named_parameters() if "lora_" not in n}
    tau = 0.3
    PolyakUpdater(online, target).update(tau)
    for mt, w_t, w_o in zip(lora_target, before_t, now_o, strict=True):
        torch.testing.assert_close(mt.effective_weight(), tau * w_o + (1 - tau) * w_t)
        assert torch.count_nonzero(mt.lora_B) == 0
    for n, p in target.named_parameters():
        if "lora_" not in n:
            torch.testing.assert_close(p, tau * dense_o[n] + (1 - tau) * dense_t[n])
    # tau = 1 makes the target's output equal the online critic's output.
    PolyakUpdater(online, target).update(1.0)
    x, a = torch.randn(8, OBS), torch.rand(8, ACT) * 2 - 1
    torch.testing.assert_close(target(x, a), online(x, a), atol=1e-5, rtol=1e-5)


def test_make_target_starts_equal_with_zero_b() -> None:
    learner = make("fasttd3", "simbav2_lora")
    x, a = torch.randn(8, OBS), torch.rand(8, ACT) * 2 - 1
    torch.testing.assert_close(learner.critic_target(x, a), learner.critic(x, a))
    target = make_target(learner.critic)
    assert all(
        torch.count_nonzero(m.lora_B) == 0 for m in target.modules() if isinstance(m, LoRALinear)
    )
    assert not any(p.requires_grad for p in target.parameters())


def test_param_groups_adapters_own_weight_decay_and_no_frozen_base() -> None:
    learner = make("fasttd3", "simbav2_lora", adapter_weight_decay=6e-4)
    groups = param_groups(learner.critic, weight_decay=0.1, adapter_weight_decay=6e-4)
    adapter_ids = {id(p) for n, p in learner.critic.named_parameters() if "lora_" in n}
    assert {id(p) for p in groups[0]["params"]} == adapter_ids
    assert groups[0]["weight_decay"] == pytest.approx(6e-4)
    assert groups[1]["weight_decay"] == 0.0
    in_groups = {id(p) for g in learner.critic_optimizer.param_groups for p in g["params"]}
    bases = [m.base_weight for m in learner.critic.modules() if isinstance(m, LoRALinear)]
    assert bases and all(id(b) not in in_groups for b in bases)
    before = [b.clone() for b in bases]
    for _ in range(5):
        learner.critic_update(bandit_batch(32))
    for b0, b1 in zip(before, bases, strict=True):
        torch.testing.assert_close(b0, b1, rtol=0, atol=0)


def test_update_returns_device_tensors_only() -> None:
    for name in ("fasttd3", "fastsac"):
        learner = make(name, "simbav2_lora")
        metrics = UpdateStep(learner)(bandit_batch(32, bootstrap=1.0))
        assert "critic_loss" in metrics and "actor_loss" in metrics
        assert metrics and all(
            isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values()
        )


def test_sac_alpha_moves_toward_target_entropy() -> None:
    torch.manual_seed(4)
    learner = make("fastsac", "mlp", alpha_init=0.1, target_entropy=-100.0, alpha_lr=1e-2)
    assert isinstance(learner, FastSACLearner)
    a0 = learner.log_alpha.item()
    for _ in range(20):
        learner.critic_update(bandit_batch(32, bootstrap=1.0))
    # Entropy far above the target → α must shrink.
    assert learner.log_alpha.item() < a0


def test_td3_exploration_respects_per_env_scale() -> None:
    learner = make("fasttd3", "mlp")
    obs = torch.zeros(4096, OBS)
    std = torch.zeros(4096, 1)
    std[2048:] = 0.3
    acts = learner.explore(obs, std)
    det = learner.act(obs)
    torch.testing.assert_close(acts[:2048], det[:2048])
    assert (acts[2048:] - det[2048:]).std().item() == pytest.approx(0.3, rel=0.1)
    assert acts.abs().max() <= 1.0


def test_effective_rank_of_known_spectra() -> None:
    from fast_lora_td3.algos.common import adapter_norms, effective_rank

    eye = torch.eye(6)
    assert effective_rank(eye).item() == pytest.approx(6.0, rel=1e-5)
    rank_one = torch.outer(torch.randn(8), torch.randn(5))
    assert effective_rank(rank_one).item() == pytest.approx(1.0, abs=1e-3)
    learner = make("fasttd3", "simbav2_lora")
    stats = adapter_norms(learner.critic)
    ranks = [v for k, v in stats.items() if k.endswith("effective_rank")]
    assert ranks and all(
        1.0 <= r.item() <= 4.0 + 1e-4 for r in ranks
    )  # ΔW = (α/r)(AB)ᵀ has rank ≤ r = 4


CRITIC_VARIANTS = {
    "mlp": {},
    "mlp_silu_ln": {"activation": "silu_layernorm"},
    "mlp_lora": {},
    "simbav2": {},
    "simbav2_lora": {},
}
ACTOR_VARIANTS = {
    "mlp": {},
    "mlp_silu_ln": {"activation": "silu_layernorm"},
    "simbav2": {"family": "simbav2", "width": 16},
}


def _kept_from_decay(module: torch.nn.Module) -> set[str]:
    """Names that must not decay: every Scaler / LayerNorm parameter and every bias."""
    from fast_lora_td3.nn import EnsembleLayerNorm, Scaler

    names = set()
    for mod_name, mod in module.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            if isinstance(mod, (Scaler, EnsembleLayerNorm)) or p_name == "bias":
                names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


@pytest.mark.parametrize("algo_name", ["fasttd3", "fastsac"])
@pytest.mark.parametrize("actor_name", list(ACTOR_VARIANTS))
@pytest.mark.parametrize("critic_name", list(CRITIC_VARIANTS))
def test_param_groups_never_decay_scalers_norms_biases(
    critic_name: str, actor_name: str, algo_name: str
) -> None:
    """Issue 10: with the default weight decay, Scalers (and norms, biases) must not decay in any
    family; linear weights of dense networks do; LoRA adapters keep their own decay."""
    family = critic_name.split("_silu")[0]
    critic_cfg = small_critic(family)
    for k, v in CRITIC_VARIANTS[critic_name].items():
        setattr(critic_cfg, k, v)
    actor_cfg = ActorConfig(hidden_dims=[32, 32], **ACTOR_VARIANTS[actor_name])
    algo = AlgoConfig(name=algo_name, num_atoms=51, v_min=-5.0, v_max=5.0, weight_decay=0.1)
    learner = make_learner(algo, critic_cfg, actor_cfg, OBS, OBS, ACT, "cpu")
    for net, opt in (
        (learner.critic, learner.critic_optimizer),
        (learner.actor, learner.actor_optimizer),
    ):
        names = {id(p): n for n, p in net.named_parameters()}
        listing = {
            g["name"]: ({names[id(p)] for p in g["params"]}, g["weight_decay"])
            for g in opt.param_groups
        }
        grouped = [n for members, _ in listing.values() for n in members]
        assert sorted(grouped) == sorted(names.values())  # a partition of the trainable params
        kept = _kept_from_decay(net)
        assert kept, "every family has a Scaler, a norm or a bias"
        decayed = {n for members, wd in listing.values() if wd > 0 for n in members}
        assert decayed.isdisjoint(kept), decayed & kept
        if "adapters" in listing:
            assert listing["adapters"][1] == pytest.approx(algo.adapter_weight_decay)
            assert all(n.endswith(("lora_A", "lora_B")) for n in listing["adapters"][0])
            assert listing["dense"][1] == 0.0
        else:
            assert listing["decay"][1] == pytest.approx(0.1)
            assert listing["decay"][0] == set(names.values()) - kept
        # Behaviour: a step with zero gradients changes only what decays.
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        for group in opt.param_groups:
            group["lr"] = 0.1
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        opt.step()
        for n, p in net.named_parameters():
            moves = n in decayed and bool(before[n].count_nonzero())  # zero-initialised heads stay
            assert torch.equal(p, before[n]) != moves, n


def test_sac_alpha_loss_differentiates_through_exp_and_uses_adamw_betas() -> None:
    """Issue 10: the FastSAC recipe's α loss `−α·mean(log π + H̄)` with `α = exp(log α)`, so
    ∂loss/∂log α = −α·mean(log π + H̄) = α·(entropy − H̄); α's optimiser is AdamW with algo.betas."""
    torch.manual_seed(5)
    learner = make("fastsac", "mlp", alpha_init=0.1, target_entropy=-1.5, betas=[0.9, 0.95])
    opt = learner.alpha_optimizer
    assert isinstance(opt, torch.optim.AdamW)
    assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.95)
    assert opt.param_groups[0]["weight_decay"] == 0.0
    assert opt.param_groups[0]["params"] == [learner.log_alpha]
    loss, metrics = learner.critic_loss(bandit_batch(64, bootstrap=1.0))
    loss.backward()
    alpha, entropy = 0.1, metrics["entropy"]
    expected_grad = alpha * (entropy - (-1.5))
    torch.testing.assert_close(learner.log_alpha.grad, expected_grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(metrics["alpha_loss"], expected_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("algo_name", ["fasttd3", "fastsac"])
def test_simbav2_rows_stay_unit_through_learner_updates(algo_name: str) -> None:
    """Every HyperDense of a SimbaV2 critic and actor (heads' output layers included) is back on
    the unit sphere after each learner update."""
    from fast_lora_td3.nn import HyperDense

    torch.manual_seed(6)
    actor_cfg = ActorConfig(family="simbav2", width=16)
    algo = AlgoConfig(name=algo_name, num_atoms=51, v_min=-5.0, v_max=5.0, critic_lr=1e-2)
    algo.actor_lr = 1e-2
    learner = make_learner(algo, small_critic("simbav2"), actor_cfg, OBS, OBS, ACT, "cpu")
    step = UpdateStep(learner)  # policy_frequency=1: an actor update after every critic update
    for _ in range(3):
        step(bandit_batch(32, bootstrap=1.0))
        for net in (learner.critic, learner.actor):
            layers = [m for m in net.modules() if isinstance(m, HyperDense)]
            assert layers
            for m in layers:
                norms = torch.linalg.vector_norm(m.effective_weight().detach().double(), dim=-1)
                torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


@pytest.mark.parametrize("algo_name", ["fasttd3", "fastsac"])
def test_cosine_schedule_before_the_first_actor_step_is_quiet(algo_name: str) -> None:
    """A valid `algo.lr_min`: the schedule advances per env step, the delayed actor has not
    stepped yet; no PyTorch order warning, and the critic and actor LRs both moved."""
    algo = AlgoConfig(name=algo_name, num_atoms=51, v_min=-5.0, v_max=5.0, batch_size=64)
    algo.lr_min = 1e-5
    learner = make_learner(
        algo, small_critic("mlp"), ActorConfig(hidden_dims=[32, 32]), OBS, OBS, ACT, "cpu", 10
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.critic_update(bandit_batch(32))  # the critic stepped, the actor not yet
        learner.step_schedulers()
        warnings.warn("still shown", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["still shown"]
    for opt, lr in (
        (learner.critic_optimizer, algo.critic_lr),
        (learner.actor_optimizer, algo.actor_lr),
    ):
        assert float(opt.param_groups[0]["lr"]) < lr


@pytest.mark.parametrize("family", ["mlp", "simbav2"])
def test_actor_preact_l2_adds_its_closed_form(family: str) -> None:
    """`algo.actor_preact_l2=c` adds exactly `c · mean(u²)` of the pre-tanh output `u` to the TD3
    actor loss, and `tanh(u)` is the actor's action for either actor family."""
    from fast_lora_td3.nn.actor import DeterministicActor

    torch.manual_seed(0)
    plain, penalised = make(actor_preact_l2=0.0), make(actor_preact_l2=0.25)
    penalised.load_state_dict(plain.state_dict())
    batch = bandit_batch(64)
    obs, _ = plain.normalize(batch.obs, batch.critic_obs)
    gap = penalised.actor_loss(batch)[0] - plain.actor_loss(batch)[0]
    torch.testing.assert_close(gap, 0.25 * plain.actor.preactivation(obs).square().mean())

    actor = DeterministicActor(OBS, ACT, ActorConfig(family=family, hidden_dims=[16], width=16))
    obs = torch.randn(32, OBS)
    assert torch.equal(torch.tanh(actor.preactivation(obs)), actor(obs))
