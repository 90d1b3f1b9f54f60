"""Policy export for deployment: ONNX + TorchScript + policy.json.

The exported graph is `actor(normalise(obs))`, deterministic, with the observation normaliser inside.
It never contains the critic or any LoRA part.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import fast_lora_td3
from fast_lora_td3.runs.atomic_io import atomic_write_bytes
from fast_lora_td3.runs.run_logger import ensure_dir

ONNX_OPSET = 17
"""ONNX opset of the exported graph (17: the first with a LayerNormalization op, used by SiLU+LN actors)."""
CONTRACT_FORMAT = "fast_lora_td3.policy/1"
"""Version tag of the policy.json / ONNX-metadata contract."""
VERIFY_ATOL = 1e-5
"""Largest |ONNX − torch| and |TorchScript − torch| accepted when exporting."""
EXPORT_FILES = {"onnx": "onnx", "torchscript": "pt", "json": "json"}
TORCH_EXPORT_NOTICES = (
    (FutureWarning, r"`torch\.jit\.\w+` is deprecated"),
    (DeprecationWarning, r"You are using the legacy TorchScript-based ONNX export"),
    (DeprecationWarning, r"The feature will be removed"),
    (UserWarning, r"Constant folding - Only steps=1 can be constant folded"),
)
"""torch's notices on the TorchScript and legacy ONNX exporters, which export uses on purpose (the
file formats are stable), and the ONNX optimiser's note that a strided slice stays unfolded (the
graph is checked against torch after export anyway); every other warning still reaches the user."""


@contextlib.contextmanager
def quiet_torch_export_notices() -> Iterator[None]:
    """Drop exactly `TORCH_EXPORT_NOTICES` inside the block."""
    with warnings.catch_warnings():
        for category, message in TORCH_EXPORT_NOTICES:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


@dataclass
class ExportArgs:
    """The keys `export` reads itself; every other key=value overrides the run's saved config."""

    checkpoint: str | None = None
    """Checkpoint file, or a run directory (its latest checkpoint) whose policy is exported."""
    out: str | None = None
    """Output directory of policy.onnx, policy.pt and policy.json (default: <run>/exported)."""


class DeployedPolicy(nn.Module):
    """Deterministic actor with its observation normaliser: obs [B, obs_dim] → actions [B, act]."""

    def __init__(
        self, actor: nn.Module, normalizer: nn.Module | None, stochastic_head: bool
    ) -> None:
        super().__init__()
        self.actor = copy.deepcopy(actor).cpu().eval()
        self.normalizer = copy.deepcopy(normalizer).cpu().eval() if normalizer is not None else None
        self.stochastic_head = stochastic_head

    def forward(self, obs: Tensor) -> Tensor:
        x = self.normalizer(obs) if self.normalizer is not None else obs
        if self.stochastic_head:
            mean, _ = self.actor(x)
            return torch.tanh(mean)
        return self.actor(x)


def deployed_policy(learner: Any) -> DeployedPolicy:
    """The deployable module of a FastTD3 / FastSAC learner."""
    normalizer = learner.obs_normalizer if learner.algo.obs_normalization else None
    return DeployedPolicy(learner.actor, normalizer, stochastic_head=learner.algo.name == "fastsac")


def _commit() -> str:
    """The source commit: $FAST_LORA_TD3_COMMIT (set in container builds), else `git rev-parse`."""
    if os.environ.get("FAST_LORA_TD3_COMMIT"):
        return os.environ["FAST_LORA_TD3_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def deployment_contract(learner: Any, env: Any, cfg: Any, step: int) -> dict[str, Any]:
    """The policy.json contract: obs layout, action scale, joints, gains, dt, task, provenance.

    Simulator facts come from `env.deployment_info()` (None where a backend cannot read them; such
    keys are listed under "unknown"); the learner and config give the tensor interface.
    """
    info = dict(env.deployment_info()) if hasattr(env, "deployment_info") else {}
    contract: dict[str, Any] = {
        "format": CONTRACT_FORMAT,
        "task": cfg.env.task,
        "backend": cfg.env.backend,
        "algo": learner.algo.name,
        "actor_family": getattr(getattr(cfg, "actor", None), "family", None),
        "obs_dim": int(learner.obs_dim),
        "action_dim": int(learner.action_dim),
        "input": "obs",
        "output": "actions",
        "actions_range": [-1.0, 1.0],
        "normalizer_inside": bool(learner.algo.obs_normalization),
        "onnx_opset": ONNX_OPSET,
        "checkpoint_step": int(step),
        "package_version": fast_lora_td3.__version__,
        "commit": _commit(),
    }
    for key, value in info.items():
        contract.setdefault(key, value)  # the learner's interface wins over simulator facts
    return contract


def verify_export(
    policy: nn.Module, onnx_path: Path, pt_path: Path, obs_dim: int, atol: float = VERIFY_ATOL
) -> float:
    """Compare onnxruntime and the TorchScript file with the eager policy on random observations
    (batch 1 and 7: the batch axis must be dynamic). Raises RuntimeError on a mismatch; returns
    the largest absolute difference."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    with quiet_torch_export_notices():
        scripted = torch.jit.load(str(pt_path), map_location="cpu")
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for batch in (1, 7):
        obs = torch.randn(batch, obs_dim, generator=gen) * 3.0
        with torch.no_grad():
            ref = policy(obs)
            ts = scripted(obs)
        ox = torch.from_numpy(session.run(["actions"], {"obs": obs.numpy()})[0])
        for name, out in (("onnx", ox), ("torchscript", ts)):
            if out.shape != ref.shape:
                raise RuntimeError(
                    f"export check: {name} output shape {tuple(out.shape)} != "
                    f"{tuple(ref.shape)} for a batch of {batch}"
                )
            err = float((out - ref).abs().max())
            if not err <= atol:
                raise RuntimeError(f"export check: {name} differs from torch by {err:.3g} > {atol}")
            worst = max(worst, err)
    return worst


def export_policy(learner: Any, env: Any, out_dir: Path, cfg: Any, step: int) -> dict[str, Path]:
    """Write policy.onnx, policy.pt and policy.json to `out_dir` (each atomically) after checking
    that ONNX and TorchScript reproduce the torch policy; returns their paths."""
    import onnx

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy = deployed_policy(learner)
    example = torch.randn(2, learner.obs_dim, generator=torch.Generator().manual_seed(0))
    contract = deployment_contract(learner, env, cfg, step)
    paths = {kind: out_dir / f"policy.{ext}" for kind, ext in EXPORT_FILES.items()}
    tmp_onnx, tmp_pt = out_dir / ".policy.onnx.export", out_dir / ".policy.pt.export"
    try:
        with quiet_torch_export_notices():
            torch.onnx.export(
                policy,
                (example,),
                str(tmp_onnx),
                input_names=["obs"],
                output_names=["actions"],
                dynamic_axes={"obs": {0: "batch"}, "actions": {0: "batch"}},
                opset_version=ONNX_OPSET,
                dynamo=False,
            )
            scripted = torch.jit.trace(policy, example)
        model = onnx.load(str(tmp_onnx))
        model.producer_name = "fast_lora_td3"
        model.producer_version = fast_lora_td3.__version__
        for key, value in contract.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, json.dumps(value)
        onnx.checker.check_model(model)
        atomic_write_bytes(tmp_onnx, model.SerializeToString())
        scripted.save(str(tmp_pt))
        verify_export(policy, tmp_onnx, tmp_pt, learner.obs_dim)
        os.replace(tmp_onnx, paths["onnx"])
        os.replace(tmp_pt, paths["torchscript"])
    finally:
        for tmp in (tmp_onnx, tmp_pt):
            tmp.unlink(missing_ok=True)
    atomic_write_bytes(paths["json"], (json.dumps(contract, indent=2) + "\n").encode())
    return paths


def read_onnx_metadata(path: Path) -> dict[str, Any]:
    """The contract embedded in an exported ONNX file."""
    import onnx

    model = onnx.load(str(path))
    return {p.key: json.loads(p.value) for p in model.metadata_props}


def run_export(overrides: list[str]) -> int:
    """`fast-lora-td3 export`: write a checkpoint's policy into `<run>/exported/` (or `out=DIR`)."""
    from fast_lora_td3.deploy.inference import (
        build_learner,
        load_for_inference,
        resolve_checkpoint,
        split_overrides,
    )
    from fast_lora_td3.envs import make_env  # the command's imports: export_policy needs none

    own, rest = split_overrides(overrides)
    ckpt = resolve_checkpoint(own.get("checkpoint"))
    cfg, state = load_for_inference(ckpt, rest)
    out = Path(own.get("out") or ckpt.parent.parent / "exported")
    ensure_dir("out", out)  # before the env starts: a bad path is one line, not a traceback
    cfg.env.num_envs = 1
    env = make_env(cfg.env)
    try:
        learner = build_learner(cfg, env, state)
        paths = export_policy(learner, env, out, cfg, int(state.get("env_steps", 0)))
    finally:
        env.close()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
