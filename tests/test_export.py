"""Policy export: ONNX / TorchScript equal the torch policy, the contract round-trips, and
the ONNX policy drives mjlab cartpole to the torch policy's return (sim-to-sim)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from cli_helpers import SMALL, cli

from fast_lora_td3.algos import make_learner
from fast_lora_td3.config.compose import compose_config, compose_run_config
from fast_lora_td3.deploy.export import (
    ONNX_OPSET,
    deployed_policy,
    export_policy,
    read_onnx_metadata,
)
from fast_lora_td3.deploy.play import onnx_policy
from fast_lora_td3.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit:FutureWarning")

OBS_DIM, ACT_DIM = 11, 3


class FakeEnv:
    """Just the deployment facts an env reports."""

    def deployment_info(self) -> dict:
        return {
            "control_dt": 0.02,
            "action_scale": [0.25, 0.5, 0.5],
            "joint_names": ["hip", "knee", "ankle"],
            "default_joint_pos": [0.1, -0.2, 0.3],
            "kp": [40.0, 40.0, 20.0],
            "kd": [1.0, 1.0, 0.5],
            "observation_layout": [
                {"name": "joint_pos", "size": 3, "scale": None},
                {"name": "joint_vel", "size": 3, "scale": 0.05},
                {"name": "command", "size": 5, "scale": [1.0, 1.0, 1.0, 1.0, 1.0]},
            ],
        }


def trained_like_learner(algo: str, actor: str, *extra: str):
    """A learner whose normaliser holds non-trivial statistics and whose actor moved off its init."""
    overrides = [*SMALL, f"algo={algo}", f"actor={actor}", *extra]
    if actor == "simbav2":
        overrides += ["actor.width=32"]
    cfg = compose_config(overrides)
    torch.manual_seed(0)
    learner = make_learner(
        cfg.algo, cfg.critic, cfg.actor, OBS_DIM, OBS_DIM, ACT_DIM, torch.device("cpu")
    )
    gen = torch.Generator().manual_seed(1)
    learner.update_normalizers(
        torch.randn(256, OBS_DIM, generator=gen) * 4 + 2, torch.randn(256, OBS_DIM, generator=gen)
    )
    with torch.no_grad():
        for p in learner.actor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return cfg, learner


@pytest.mark.parametrize(
    ("algo", "actor"),
    [("fasttd3", "mlp"), ("fasttd3", "simbav2"), ("fastsac", "mlp"), ("fastsac", "simbav2")],
)
def test_onnx_and_torchscript_equal_torch_policy(tmp_path: Path, algo: str, actor: str) -> None:
    cfg, learner = trained_like_learner(algo, actor)
    paths = export_policy(learner, FakeEnv(), tmp_path, cfg, step=1234)
    session = ort.InferenceSession(str(paths["onnx"]), providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(paths["torchscript"]))
    gen = torch.Generator().manual_seed(2)
    # Random observations of several batch sizes, and a "recorded" trajectory-like sequence.
    walk = torch.cumsum(0.3 * torch.randn(50, OBS_DIM, generator=gen), 0) + 2.0
    for obs in (torch.randn(1, OBS_DIM, generator=gen), 5 * torch.randn(64, OBS_DIM), walk):
        ref = learner.act(obs)
        ox = torch.from_numpy(session.run(["actions"], {"obs": obs.numpy()})[0])
        assert ox.shape == ref.shape
        assert torch.allclose(ox, ref, atol=1e-5, rtol=0), (ox - ref).abs().max()
        assert torch.allclose(scripted(obs), ref, atol=1e-5, rtol=0)
        assert ref.abs().max() <= 1.0
    # The deterministic policy really depends on the normaliser: a wrong mean would change it.
    stale = deployed_policy(learner)
    stale.normalizer.mean.zero_()
    assert not torch.allclose(stale(walk), learner.act(walk), atol=1e-3)


def test_normaliser_eps_setting_reaches_both_normalisers_and_the_export(tmp_path: Path) -> None:
    cfg, learner = trained_like_learner("fasttd3", "mlp", "algo.obs_norm_eps=1.0")
    for norm in (learner.obs_normalizer, learner.critic_obs_normalizer):
        assert norm.eps == 1.0
    norm = learner.obs_normalizer
    obs = torch.randn(8, OBS_DIM) * 4 + 2
    assert torch.allclose(norm(obs), (obs - norm.mean) / (norm.var.sqrt() + 1.0))
    paths = export_policy(learner, FakeEnv(), tmp_path, cfg, step=1)
    ox = onnx_policy(paths["onnx"], torch.device("cpu"))(obs)
    assert torch.allclose(ox, learner.act(obs), atol=1e-5, rtol=0)
    norm.eps = 1e-2  # the same statistics under the recipe's eps give another policy
    assert not torch.allclose(ox, learner.act(obs), atol=1e-3)


def test_critic_obs_norm_eps_reaches_only_the_critic_normaliser(tmp_path: Path) -> None:
    """The critic's σ floor leaves the actor's normaliser, and so the exported policy, unchanged."""
    cfg, learner = trained_like_learner("fasttd3", "mlp", "algo.critic_obs_norm_eps=1.0")
    _, recipe = trained_like_learner("fasttd3", "mlp")
    assert learner.critic_obs_normalizer.eps == 1.0
    assert learner.obs_normalizer.eps == recipe.obs_normalizer.eps == cfg.algo.obs_norm_eps
    assert recipe.critic_obs_normalizer.eps == cfg.algo.obs_norm_eps  # None follows obs_norm_eps
    obs = torch.randn(8, OBS_DIM) * 4 + 2
    norm = learner.critic_obs_normalizer
    assert torch.allclose(norm(obs), (obs - norm.mean) / (norm.var.sqrt() + 1.0))
    assert not torch.allclose(norm(obs), recipe.critic_obs_normalizer(obs), atol=1e-3)
    paths = export_policy(learner, FakeEnv(), tmp_path, cfg, step=1)
    ox = onnx_policy(paths["onnx"], torch.device("cpu"))(obs)
    assert torch.allclose(ox, recipe.act(obs), atol=1e-5, rtol=0)


def test_onnx_graph_interface_and_no_critic(tmp_path: Path) -> None:
    cfg, learner = trained_like_learner("fasttd3", "mlp")
    paths = export_policy(learner, FakeEnv(), tmp_path, cfg, step=7)
    model = onnx.load(str(paths["onnx"]))
    assert [i.name for i in model.graph.input] == ["obs"]
    assert [o.name for o in model.graph.output] == ["actions"]
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.dim_value  # dynamic batch axis
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    names = [t.name for t in model.graph.initializer]
    assert not any("critic" in n or "lora" in n for n in names)
    n_weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    actor_numel = sum(p.numel() for p in learner.actor.parameters())
    assert actor_numel <= n_weights <= actor_numel + 2 * OBS_DIM  # actor + normaliser only
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_contract_round_trips_between_json_and_onnx_metadata(tmp_path: Path) -> None:
    cfg, learner = trained_like_learner("fastsac", "mlp")
    paths = export_policy(learner, FakeEnv(), tmp_path, cfg, step=4321)
    contract = json.loads(paths["json"].read_text())
    assert read_onnx_metadata(paths["onnx"]) == contract
    info = FakeEnv().deployment_info()
    for key in ("control_dt", "action_scale", "joint_names", "default_joint_pos", "kp", "kd"):
        assert contract[key] == info[key]
    assert contract["observation_layout"] == info["observation_layout"]
    assert sum(t["size"] for t in contract["observation_layout"]) == contract["obs_dim"] == OBS_DIM
    assert contract["task"] == "PointMassAsym-v0" and contract["algo"] == "fastsac"
    assert contract["checkpoint_step"] == 4321 and contract["onnx_opset"] == ONNX_OPSET
    assert contract["package_version"] and contract["commit"]
    assert (contract["input"], contract["output"]) == ("obs", "actions")


def _returns(stdout: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"torch": [], "onnx": []}
    for line in stdout.splitlines():
        name = line.split(" ", 1)[0]
        if name in out and " return " in line:
            out[name].append(float(line.split(" return ")[1].split()[0]))
    return out


def test_play_and_export_compose_a_saved_config_like_train() -> None:
    """The saved run's config takes overrides through the same Hydra composition as `train`:
    same typed result for the same overrides, same one-line error for the same mistake."""
    from omegaconf import OmegaConf

    trained = compose_config(SMALL)
    saved = OmegaConf.to_container(OmegaConf.structured(trained))
    again = compose_run_config(saved, [])
    assert again == trained
    overrides = ["eval.num_envs=3", "eval.max_steps=null", "critic.hidden_dims=[8,8]", "seed=7"]
    assert compose_run_config(saved, overrides) == compose_config([*SMALL, *overrides])
    for bad in ("eval.no_such_key=1", "seed=abc"):
        with pytest.raises(ConfigError) as from_saved:
            compose_run_config(saved, [bad])
        with pytest.raises(ConfigError) as from_train:
            compose_config([bad])
        assert str(from_saved.value) == str(from_train.value)
        message = str(from_saved.value)
        assert bad.partition("=")[0] in message and "\n" not in message, message


@pytest.mark.slow
def test_train_exports_and_cli_export_and_play_agree(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = cli("train", *SMALL, "algo=fastsac", "total_steps=160", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    first = json.loads((run / "exported" / "policy.json").read_text())
    assert first["checkpoint_step"] == 160 and first["algo"] == "fastsac"
    out = tmp_path / "again"
    res = cli("export", f"checkpoint={run}", f"out={out}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_onnx_metadata(out / "policy.onnx")["checkpoint_step"] == 160
    res = cli(
        "play",
        f"checkpoint={run}",
        f"exported={out / 'policy.onnx'}",
        "episodes=2",
        "eval.num_envs=3",
        "eval.max_steps=30",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    got = _returns(res.stdout)
    assert len(got["torch"]) == len(got["onnx"]) == 2
    assert got["torch"][0] != got["torch"][1]  # different episode seeds are different episodes
    for t, o in zip(got["torch"], got["onnx"], strict=True):
        assert abs(t - o) < 1e-5
    assert "sim-to-sim" in res.stdout


@pytest.mark.slow
@pytest.mark.mjlab
def test_onnx_policy_drives_mjlab_cartpole_like_torch(tmp_path: Path) -> None:
    from fast_lora_td3.deploy.play import seeded_episode
    from fast_lora_td3.envs import make_env

    cfg = compose_config(
        ["env=mjlab", "env.task=Mjlab-Cartpole-Swingup", "env.num_envs=3", "device=cpu"]
    )
    env = make_env(cfg.env)
    try:
        torch.manual_seed(0)
        learner = make_learner(
            cfg.algo, cfg.critic, cfg.actor, env.obs_dim, env.critic_obs_dim, env.action_dim, "cpu"
        )
        recorded = [env.reset(seed=3)[0]]
        for _ in range(40):  # real cartpole observations, also used to fit the normaliser
            learner.update_normalizers(recorded[-1], recorded[-1])
            recorded.append(env.step(torch.rand(3, env.action_dim) * 2 - 1).obs)
        paths = export_policy(learner, env, tmp_path, cfg, step=0)
        act_onnx = onnx_policy(paths["onnx"], env.device)
        obs = torch.cat(recorded)
        assert torch.allclose(act_onnx(obs), learner.act(obs), atol=1e-5, rtol=0)

        torch_run = seeded_episode(learner.act, env, seed=5, max_steps=60)
        onnx_run = seeded_episode(act_onnx, env, seed=5, max_steps=60)
        other_seed = seeded_episode(learner.act, env, seed=6, max_steps=60)
    finally:
        env.close()
    assert abs(onnx_run["eval_return"] - torch_run["eval_return"]) < 1e-5
    assert onnx_run["eval_length"] == torch_run["eval_length"]
    assert other_seed["eval_return"] != torch_run["eval_return"]  # the seed controls the episode
    contract = json.loads(paths["json"].read_text())
    assert contract["joint_names"] == ["slider"] and contract["control_dt"] > 0
    assert sum(t["size"] for t in contract["observation_layout"]) == env.obs_dim


class _WarningActor(torch.nn.Module):
    """An actor that warns while it is traced: export must let such a warning through."""

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        self.inner = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():  # ONNX export and torch.jit.trace trace the policy
            warnings.warn("actor says hello", UserWarning, stacklevel=1)
        return self.inner(obs)


def test_export_drops_only_torchs_exporter_notices(tmp_path: Path) -> None:
    """torch.jit's FutureWarnings and the legacy-ONNX notices are dropped, nothing else."""
    cfg, learner = trained_like_learner("fasttd3", "mlp")
    learner.actor = _WarningActor(learner.actor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_policy(learner, FakeEnv(), tmp_path, cfg, step=1)
    messages = [str(w.message) for w in caught]
    assert "actor says hello" in messages
    assert not [m for m in messages if "torch.jit" in m or "legacy TorchScript" in m], messages
