"""Policy export for deployment (SPEC §8): ONNX + TorchScript + policy.json.

The exported graph is `actor(normalise(obs))`, deterministic, with the observation normaliser inside.
It never contains the critic or any LoRA part.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import fast_lora_td3

ONNX_OPSET = 17


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
    """The policy.json contract: obs layout, action scale, joints, gains, dt, task, provenance."""
    info = dict(env.deployment_info()) if hasattr(env, "deployment_info") else {}
    return {
        "format": "fast_lora_td3.policy/1",
        "task": cfg.env.task,
        "backend": cfg.env.backend,
        "algo": learner.algo.name,
        "obs_dim": learner.obs_dim,
        "action_dim": learner.action_dim,
        "input": "obs",
        "output": "actions",
        "actions_range": [-1.0, 1.0],
        "normalizer_inside": bool(learner.algo.obs_normalization),
        "checkpoint_step": int(step),
        "package_version": fast_lora_td3.__version__,
        "commit": _commit(),
        **info,
    }


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def export_policy(learner: Any, env: Any, out_dir: Path, cfg: Any, step: int) -> dict[str, Path]:
    """Write policy.onnx, policy.pt and policy.json to `out_dir`; returns their paths."""
    import onnx

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy = deployed_policy(learner)
    example = torch.zeros(2, learner.obs_dim)
    contract = deployment_contract(learner, env, cfg, step)

    onnx_path, pt_path, json_path = (out_dir / f"policy.{ext}" for ext in ("onnx", "pt", "json"))
    tmp_onnx = out_dir / ".policy.onnx.export"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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
    model = onnx.load(str(tmp_onnx))
    tmp_onnx.unlink()
    for key, value in contract.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    _atomic_write_bytes(onnx_path, model.SerializeToString())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.trace(policy, example)
    tmp_pt = out_dir / ".policy.pt.tmp"
    scripted.save(str(tmp_pt))
    os.replace(tmp_pt, pt_path)
    _atomic_write_bytes(json_path, (json.dumps(contract, indent=2) + "\n").encode())
    return {"onnx": onnx_path, "torchscript": pt_path, "json": json_path}


def read_onnx_metadata(path: Path) -> dict[str, Any]:
    """The contract embedded in an exported ONNX file."""
    import onnx

    model = onnx.load(str(path))
    return {p.key: json.loads(p.value) for p in model.metadata_props}
