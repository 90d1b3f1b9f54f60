"""Critics and actors: families, batched members, parameter groups, SAC log-prob."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from fast_lora_td3.errors import ConfigError
from fast_lora_td3.nn import (
    ActorConfig,
    CriticConfig,
    DeterministicActor,
    HyperDense,
    LoRALinear,
    SimbaV2Head,
    TanhGaussianActor,
    TwinCritic,
    adapter_parameters,
    build_actor,
    build_critic,
    dense_trainable_parameters,
    project_weights_,
)

OBS, ACT, ATOMS = 7, 3, 11

SMALL = {
    "mlp": {"hidden_dims": [32, 24]},
    "mlp_silu": {"family": "mlp", "hidden_dims": [32, 24], "activation": "silu_layernorm"},
    "mlp_lora": {"hidden_dims": [32, 24], "rank": 4},
    "mlp_lora_all": {
        "family": "mlp_lora",
        "hidden_dims": [32, 24],
        "rank": 4,
        "lora_layers": ["all"],
    },
    "simbav2": {"width": 16, "num_blocks": 2},
    "simbav2_lora": {"width": 16, "num_blocks": 2, "rank": 4},
    "simbav2_lora_all": {
        "family": "simbav2_lora",
        "width": 16,
        "num_blocks": 1,
        "rank": 4,
        "lora_layers": ["blocks", "embedder", "head"],
    },
    "simbav2_lora_fwd": {
        "family": "simbav2_lora",
        "width": 16,
        "num_blocks": 1,
        "rank": 4,
        "weight_norm": "forward",
        "lora_init": "zero_b",
    },
}


def _cfg(name: str, **over: object) -> CriticConfig:
    kw = {"family": name, **SMALL[name], **over}
    return CriticConfig(**kw)


def _critic(name: str, seed: int = 0, **over: object) -> TwinCritic:
    torch.manual_seed(seed)
    return build_critic(_cfg(name, **over), OBS, ACT, ATOMS)


@pytest.mark.parametrize("name", list(SMALL))
def test_every_family_forward_backward(name: str) -> None:
    critic = _critic(name)
    obs, act = torch.randn(5, OBS), torch.randn(5, ACT)
    out = critic(obs, act)
    assert out.shape == (2, 5, ATOMS)
    assert torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    for n, p in critic.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    # Members are distinct networks.
    assert not torch.allclose(out[0], out[1])


@pytest.mark.parametrize("name", list(SMALL))
def test_batched_members_equal_each_member_alone(name: str) -> None:
    critic = _critic(name, seed=1)
    single = _critic(name, seed=2, num_members=1)
    obs, act = torch.randn(6, OBS), torch.randn(6, ACT)
    obs_e, act_e = torch.randn(2, 6, OBS), torch.randn(2, 6, ACT)
    out, out_e = critic(obs, act), critic(obs_e, act_e)
    for m in range(2):
        # Every critic tensor has the leading member axis: slice member m into a 1-member critic.
        single.load_state_dict({k: v[m : m + 1] for k, v in critic.state_dict().items()})
        torch.testing.assert_close(single(obs, act)[0], out[m], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(single(obs_e[m], act_e[m])[0], out_e[m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "simbav2_lora"])
def test_ensemble_gradient_reaches_every_member(name: str) -> None:
    critic = _critic(name, seed=3)
    critic(torch.randn(8, OBS), torch.randn(8, ACT)).square().mean().backward()
    for n, p in critic.named_parameters():
        assert p.shape[0] == 2, n
        for m in range(2):
            assert p.grad[m].abs().sum() > 0, f"{n} member {m}"


@pytest.mark.parametrize("name", ["simbav2_lora", "simbav2_lora_all", "mlp_lora", "mlp_lora_all"])
def test_lora_param_groups_and_frozen_base(name: str) -> None:
    critic = _critic(name, seed=4)
    adapters, dense = adapter_parameters(critic), dense_trainable_parameters(critic)
    named = dict(critic.named_parameters())
    adapter_names = {n for n, p in named.items() if any(p is a for a in adapters)}
    assert adapter_names and all(n.endswith(("lora_A", "lora_B")) for n in adapter_names)
    assert {n for n in named if n.endswith(("lora_A", "lora_B"))} == adapter_names
    # Adapters and dense parts partition the trainable parameters.
    assert len(adapters) + len(dense) == len(named)
    assert {id(p) for p in adapters}.isdisjoint(id(p) for p in dense)
    bases = {n: b.clone() for n, b in critic.named_buffers() if n.endswith("base_weight")}
    assert bases and not any(n.endswith("base_weight") for n in named)
    # Which linears are adapted follows cfg.lora_layers.
    loras = [n for n, m in critic.named_modules() if isinstance(m, LoRALinear)]
    if name == "simbav2_lora":
        assert loras and all(".blocks." in n for n in loras)
    if name == "mlp_lora":
        assert len(loras) == 2  # hidden layers only, not the output layer
    if name == "mlp_lora_all":
        assert len(loras) == 3

    opt = torch.optim.AdamW(
        [{"params": adapters, "weight_decay": 6e-4}, {"params": dense, "weight_decay": 0.0}],
        lr=1e-2,
    )
    before = {n: p.detach().clone() for n, p in named.items()}
    for _ in range(100):
        loss = critic(torch.randn(16, OBS), torch.randn(16, ACT)).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        project_weights_(critic)
    for n, b in critic.named_buffers():
        if n in bases:
            assert torch.equal(b, bases[n]), n
    assert all(not torch.equal(before[n], p) for n, p in named.items())
    if name.startswith("simbav2"):  # LoRA-WN kept every HyperDense row on the sphere
        for m in critic.modules():
            if isinstance(m, HyperDense):
                norms = torch.linalg.vector_norm(m.effective_weight().detach().double(), dim=-1)
                torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def test_dense_critic_has_no_adapters() -> None:
    critic = _critic("simbav2")
    assert adapter_parameters(critic) == []
    assert len(dense_trainable_parameters(critic)) == len(list(critic.parameters()))


@pytest.mark.parametrize(
    ("over", "setting"),
    [
        ({"family": "transformer"}, "critic.family"),
        ({"family": "simbav2_lora", "lora_layers": ["hidden"]}, "critic.lora_layers"),
        ({"family": "mlp_lora", "lora_layers": []}, "critic.lora_layers"),
        ({"family": "simbav2_lora", "rank": 16}, "critic.rank"),
        ({"family": "simbav2_lora", "rank": 0}, "critic.rank"),
        ({"family": "mlp", "activation": "gelu"}, "critic.activation"),
        ({"family": "mlp", "num_members": 0}, "critic.num_members"),
        ({"family": "simbav2_lora", "weight_norm": "both"}, "critic.weight_norm"),
        ({"family": "simbav2_lora", "rank": 4, "lora_init": "zero_b"}, "critic.lora_init"),
        (
            {"family": "simbav2_lora", "rank": 4, "kernel_init_scale": 1.0},
            "critic.kernel_init_scale",
        ),
    ],
)
def test_bad_critic_config_raises(over: dict, setting: str) -> None:
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")) as info:
        cfg = CriticConfig(**{"width": 16, "num_blocks": 1, "hidden_dims": [16], **over})
        build_critic(cfg, OBS, ACT, ATOMS)
    assert "\n" not in str(info.value)
    if setting == "critic.family":
        assert all(f in str(info.value) for f in ("mlp", "simbav2", "simbav2_lora", "mlp_lora"))


def test_critic_forward_traces_without_graph_breaks() -> None:
    torch._dynamo.reset()
    critic = _critic("simbav2_lora", seed=5)
    compiled = torch.compile(critic, backend="eager", fullgraph=True)
    obs, act = torch.randn(4, OBS), torch.randn(4, ACT)
    torch.testing.assert_close(compiled(obs, act), critic(obs, act))


# ----------------------------------------------------------------------------------- actors


@pytest.mark.parametrize("family", ["mlp", "simbav2"])
@pytest.mark.parametrize("activation", ["relu", "silu_layernorm"])
def test_deterministic_actor(family: str, activation: str) -> None:
    torch.manual_seed(6)
    cfg = ActorConfig(family=family, activation=activation, width=16, last_layer_std=0.01)
    actor = build_actor(cfg, OBS, 32, kind="td3")
    assert isinstance(actor, DeterministicActor)
    assert torch.count_nonzero(actor.out.bias) == 0
    if family == "mlp":
        assert actor.out.weight.std().item() == pytest.approx(0.01, abs=1.5e-3)
    else:  # SimbaV2 head: unit-norm output rows, as the official heads
        norms = torch.linalg.vector_norm(actor.out.out.effective_weight().double(), dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-6, rtol=0)
    obs = torch.randn(9, OBS) * 100
    a = actor(obs)
    assert a.shape == (9, 32) and a.abs().max() <= 1
    torch.testing.assert_close(actor.act(obs, deterministic=True), a)
    a.sum().backward()
    assert all(p.grad is not None for p in actor.parameters())
    if family == "mlp":
        widths = [m.out_features for m in actor.trunk if hasattr(m, "out_features")]
        assert widths == [512, 256, 128]


def _randomise_heads(actor: TanhGaussianActor, scale: float) -> None:
    with torch.no_grad():
        for head in (actor.mean, actor.log_std):
            weight = head.out.linear.weight if isinstance(head, SimbaV2Head) else head.weight
            weight.normal_(0.0, scale)
            head.bias.normal_(0.0, scale)


@pytest.mark.parametrize("family", ["mlp", "simbav2"])
def test_tanh_gaussian_log_prob_matches_torch_distributions(family: str) -> None:
    torch.manual_seed(7)
    cfg = ActorConfig(family=family, hidden_dims=[32, 16], width=16)
    actor = build_actor(cfg, OBS, 4, kind="sac").double()
    assert isinstance(actor, TanhGaussianActor)
    _randomise_heads(actor, 0.7)
    obs = torch.randn(64, OBS, dtype=torch.float64)
    gen = torch.Generator().manual_seed(123)
    action, log_prob = actor.sample(obs, generator=gen)
    assert action.shape == (64, 4) and log_prob.shape == (64,)
    mean, log_std = actor(obs)
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(123), dtype=torch.float64)
    u = mean + log_std.exp() * eps
    torch.testing.assert_close(action, torch.tanh(u))
    base = Normal(mean, log_std.exp())
    tanh = TanhTransform()
    ref = (base.log_prob(u) - tanh.log_abs_det_jacobian(u, torch.tanh(u))).sum(-1)
    torch.testing.assert_close(log_prob, ref, atol=1e-8, rtol=1e-8)
    # Also through TransformedDistribution on the action itself (atanh is exact for |u| moderate).
    ok = u.abs().max(-1).values < 4
    dist = TransformedDistribution(base, [tanh])
    ref2 = dist.log_prob(action).sum(-1)
    torch.testing.assert_close(log_prob[ok], ref2[ok], atol=1e-5, rtol=1e-6)
    assert ok.sum() > 32


def test_tanh_gaussian_bounds_and_stability() -> None:
    torch.manual_seed(8)
    actor = build_actor(ActorConfig(hidden_dims=[16]), OBS, 3, kind="sac")
    obs = torch.randn(10, OBS)
    mean, log_std = actor(obs)  # zero-initialised heads
    assert torch.count_nonzero(mean) == 0
    torch.testing.assert_close(log_std, torch.full_like(log_std, -2.5))
    for bias in (1e3, -1e3):
        with torch.no_grad():
            actor.log_std.bias.fill_(bias)
            actor.mean.bias.fill_(20.0)  # |u| ≈ 20: naive log(1 − tanh²) is −inf in float32
        _, log_std = actor(obs)
        assert log_std.min() >= -5.0 and log_std.max() <= 0.0
        action, log_prob = actor.sample(obs, torch.Generator().manual_seed(9))
        assert torch.isfinite(log_prob).all() and action.abs().max() <= 1
        # Closed form in float64 with log sech²(u) = 2 (log 2 − |u| − log1p(e^{−2|u|})).
        ls = 0.0 if bias > 0 else -5.0
        eps = torch.randn((10, 3), generator=torch.Generator().manual_seed(9)).double()
        u = 20.0 + math.exp(ls) * eps
        log_sech2 = 2 * (math.log(2) - u.abs() - torch.log1p(torch.exp(-2 * u.abs())))
        ref = (-0.5 * eps**2 - ls - 0.5 * math.log(2 * math.pi) - log_sech2).sum(-1)
        torch.testing.assert_close(log_prob.double(), ref, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(
        actor.act(obs, deterministic=True), torch.tanh(actor(obs)[0]), atol=0, rtol=0
    )
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    torch.testing.assert_close(actor.sample(obs, g1), actor.sample(obs, g2))


def test_tanh_gaussian_sample_traces_without_graph_breaks() -> None:
    torch._dynamo.reset()
    actor = build_actor(ActorConfig(hidden_dims=[16]), OBS, 3, kind="sac")
    compiled = torch.compile(actor.sample, backend="eager", fullgraph=True)
    a, lp = compiled(torch.randn(4, OBS))
    assert a.shape == (4, 3) and lp.shape == (4,)


@pytest.mark.parametrize(
    ("cfg", "kind", "setting"),
    [
        ({"family": "rnn"}, "td3", "actor.family"),
        ({"activation": "tanh"}, "td3", "actor.activation"),
        ({}, "ppo", "actor kind"),
        ({"family": "simbav2", "num_blocks": 0}, "sac", "actor.num_blocks"),
    ],
)
def test_bad_actor_config_raises(cfg: dict, kind: str, setting: str) -> None:
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        build_actor(ActorConfig(**cfg), OBS, ACT, kind=kind)


@pytest.mark.parametrize(
    "name", ["simbav2", "simbav2_lora", "simbav2_lora_all", "simbav2_lora_fwd"]
)
def test_simbav2_critic_head_is_unit_row_hyperdense_with_zero_bias(name: str) -> None:
    """Issue 10: the C51 output layer is a dense unit-row HyperDense (also under LoRA)
    plus a zero-initialised per-member bias; the logit scale comes from the head's Scaler."""
    critic = _critic(name, seed=9)
    head = critic.net[-1]
    assert isinstance(head, SimbaV2Head)
    assert isinstance(head.out, HyperDense) and not head.out.is_lora
    assert head.bias.shape == (2, 1, ATOMS) and torch.count_nonzero(head.bias) == 0
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    for _ in range(3):
        loss = critic(torch.randn(16, OBS), torch.randn(16, ACT)).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        project_weights_(critic)
        norms = torch.linalg.vector_norm(head.out.effective_weight().detach().double(), dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["td3", "sac"])
def test_simbav2_actor_heads_follow_official_policy(kind: str) -> None:
    """SimbaV2 actors: encoder → SimbaV2Head(s); SAC has separate mean and log-std paths (no shared
    parameters), like the official HyperNormalTanhPolicy."""
    torch.manual_seed(10)
    actor = build_actor(ActorConfig(family="simbav2", width=16), OBS, ACT, kind=kind)
    heads = [actor.out] if kind == "td3" else [actor.mean, actor.log_std]
    assert all(isinstance(h, SimbaV2Head) and torch.count_nonzero(h.bias) == 0 for h in heads)
    if kind == "sac":
        mean_ids = {id(p) for p in actor.mean.parameters()}
        assert mean_ids.isdisjoint(id(p) for p in actor.log_std.parameters())
        _, log_std = actor(torch.randn(5, OBS))
        x = actor.trunk(torch.randn(5, OBS))
        assert not torch.allclose(actor.mean(x), actor.log_std(x))
        assert log_std.min() >= -5.0 and log_std.max() <= 0.0
    for h in heads:
        norms = torch.linalg.vector_norm(h.out.effective_weight().double(), dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-6, rtol=0)


def test_fastsac_critic_preset_and_experiments() -> None:
    """Issue 10: `critic=mlp_silu_ln` is the FastSAC critic (Linear → LayerNorm → SiLU,
    768-384-192); the dense FastSAC preset uses it with the FastSAC actor, the LoRA preset swaps in
    the SimbaV2-LoRA critic and keeps the rest of the recipe."""
    from fast_lora_td3.config.compose import compose_config
    from fast_lora_td3.nn import EnsembleLayerNorm, EnsembleLinear

    cfg = compose_config(["critic=mlp_silu_ln"])
    critic = build_critic(cfg.critic, OBS, ACT, ATOMS)
    kinds = [type(m).__name__ for m in critic.net]
    assert kinds == ["EnsembleLinear", "EnsembleLayerNorm", "SiLU"] * 3 + ["EnsembleLinear"]
    widths = [m.out_features for m in critic.net if isinstance(m, EnsembleLinear)]
    assert widths == [768, 384, 192, ATOMS]
    assert all(m.ensemble_size == 2 for m in critic.net if isinstance(m, EnsembleLayerNorm))

    dense = compose_config(["experiment=g1_flat_fastsac"])
    assert dense.algo.name == "fastsac" and dense.critic.family == "mlp"
    assert list(dense.critic.hidden_dims) == [768, 384, 192]
    assert dense.critic.activation == dense.actor.activation == "silu_layernorm"
    assert list(dense.actor.hidden_dims) == [512, 256, 128]
    lora = compose_config(["experiment=g1_flat_fastsac_lora"])
    assert lora.critic.family == "simbav2_lora" and lora.actor == dense.actor
    for key in ("gamma", "tau", "batch_size", "num_atoms", "v_max", "betas", "weight_decay"):
        assert getattr(lora.algo, key) == getattr(dense.algo, key), key


@pytest.mark.parametrize(
    ("critic", "limit"),
    [
        ({"family": "simbav2_lora", "width": 32}, 32),
        ({"family": "mlp_lora", "hidden_dims": [64, 16]}, 16),
        ({"family": "mlp", "hidden_dims": [8]}, None),
        ({"family": "simbav2", "width": 8}, None),
    ],
)
def test_run_level_rank_check_uses_each_familys_adapted_widths(critic: dict, limit: int | None):
    """validate() bounds the LoRA rank by the family table's adapted widths; dense families have
    no rank to check."""
    from fast_lora_td3.config.schema import TrainConfig
    from fast_lora_td3.config.validate import validate

    cfg = TrainConfig()
    for rank in (limit or 10_000, (limit or 10_000) - 1):
        cfg.critic = CriticConfig(**critic, rank=rank)
        if limit is not None and rank >= limit:
            with pytest.raises(ConfigError, match=rf"critic\.rank={rank} .* 0 < rank < {limit}"):
                validate(cfg)
        else:
            validate(cfg)
