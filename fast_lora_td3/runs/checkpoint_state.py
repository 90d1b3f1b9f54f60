"""What a checkpoint holds beside the tensors of the learner: the RNG states that make a resume
continue bit for bit, and the check that a checkpoint's config may be resumed with the current one.

The file layer (atomic writes, rotation, loading with clear errors) is `fast_lora_td3.runs.checkpoint`.
"""

from __future__ import annotations

import fnmatch
import os
import random
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from fast_lora_td3.errors import CheckpointError

# fmt: off
RESUME_MUTABLE_KEYS: frozenset[str] = frozenset({
    "total_steps", "max_wall_s", "resume", "checkpoint", "run_dir", "run_name", "log_dir", "logger",
    "log_interval", "log_interval_s", "cpu_defaults", "checkpoint_interval", "keep_checkpoints",
    "save_replay", "progress", "device", "compile", "cuda_graph", "verify_compile", "export_at_end",
    "nan_check_interval", "nan_action", "eval", "experiment", "video",
})
# fmt: on
"""Config keys that may change between a run and its resume (run length, logging, device, speed
flags, evaluation schedule). Each entry is a dotted pattern that matches a contiguous run of a key's
components, with fnmatch wildcards per component: `device` ignores `device` and `env.device`, `eval`
ignores everything under `eval.`."""


DECISIVE_KEYS: tuple[str, ...] = (
    "env.backend",
    "env.task",
    "algo.name",
    "critic.family",
    "actor.family",
    "env.num_envs",
)
"""Keys whose mismatch says at once that a checkpoint belongs to another run: a resume error lists
them first, then the other mismatched keys alphabetically."""


# -- RNG state ----------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Capture torch CPU, CUDA (every device, if CUDA was initialised), numpy and `random` states.

    Only the global numpy RNG is captured (not `np.random.Generator` objects). The result is
    weights_only-safe: numpy's key array is stored as an int64 tensor.
    """
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": random.getstate(),
        "cuda": [],
    }
    # Querying CUDA would create a context; if it was never initialised its RNG was never used.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states captured by `rng_state()` (CUDA states only for devices present)."""
    missing = [k for k in ("torch", "numpy", "python") if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint RNG state lacks {', '.join(missing)}")
    torch.set_rng_state(state["torch"].cpu())
    npd = state["numpy"]
    key = np.asarray(torch.as_tensor(npd["key"]).cpu().numpy(), dtype=np.uint32)
    np.random.set_state(
        {
            "bit_generator": npd["bit_generator"],
            "state": {"key": key, "pos": int(npd["pos"])},
            "has_gauss": int(npd["has_gauss"]),
            "gauss": float(npd["gauss"]),
        }
    )
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda_states = list(state.get("cuda") or [])
    if cuda_states and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if n != len(cuda_states):
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda_states)} devices, this machine has "
                f"{n}; restoring the first {min(n, len(cuda_states))}",
                stacklevel=2,
            )
        for i, s in enumerate(cuda_states[:n]):
            torch.cuda.set_rng_state(s.cpu(), device=i)


# -- config compatibility -----------------------------------------------------------------------
def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings → `{dotted.key: leaf}`; sequences become lists so tuple == list."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten_config(v, key + "."))
        elif isinstance(v, list | tuple):
            out[key] = list(v)
        else:
            out[key] = v
    return out


def _ignored(key: str, patterns: Iterable[str]) -> bool:
    parts = key.split(".")
    for pat in patterns:
        pp = pat.split(".")
        for i in range(len(parts) - len(pp) + 1):
            if all(fnmatch.fnmatchcase(parts[i + j], pp[j]) for j in range(len(pp))):
                return True
    return False


def _short(value: Any, limit: int = 40) -> str:
    text = "<missing>" if value is _MISSING else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()


def check_compatible(
    saved_cfg: Mapping[str, Any],
    current_cfg: Mapping[str, Any],
    ignore: Iterable[str] = RESUME_MUTABLE_KEYS,
    *,
    source: str | os.PathLike[str] | None = None,
    max_listed: int = 6,
) -> None:
    """Raise CheckpointError naming every mismatched dotted key (checkpoint vs now), on one line.

    Keys matched by `ignore` (see RESUME_MUTABLE_KEYS) may differ. `source` (the checkpoint path)
    is named in the message when given. Mismatched DECISIVE_KEYS come first, the rest sorted.
    """
    ignore = tuple(ignore)
    saved, current = flatten_config(saved_cfg), flatten_config(current_cfg)
    diffs = []
    keys = saved.keys() | current.keys()
    first = [k for k in DECISIVE_KEYS if k in keys]
    for key in [*first, *sorted(keys - set(first))]:
        if _ignored(key, ignore):
            continue
        a, b = saved.get(key, _MISSING), current.get(key, _MISSING)
        if a is _MISSING or b is _MISSING or a != b:
            diffs.append(f"{key} (checkpoint {_short(a)}, now {_short(b)})")
    if not diffs:
        return
    listed = "; ".join(diffs[:max_listed])
    more = f"; and {len(diffs) - max_listed} more" if len(diffs) > max_listed else ""
    where = f" {source}" if source is not None else ""
    raise CheckpointError(
        f"checkpoint{where} was written with a different config: {listed}{more}; resume with the "
        "same settings or start a new run (run_dir=null resume=false)"
    )
