"""Atomic checkpoints, keep-last-K rotation, RNG state capture and resume compatibility (SPEC §7).

Crash safety: a checkpoint is written to a temp file in the same directory, flushed, fsynced and
renamed over the final name with `os.replace` (atomic on POSIX), then the directory is fsynced. The
`latest.json` pointer is replaced the same way, and only after the checkpoint it names is complete;
older files are pruned only after that. So a SIGKILL at any moment leaves either the previous or the
new pointer, each naming a complete file. If the pointer is missing or names a bad file, `latest()` /
`load()` fall back to the newest checkpoint file that is complete.

Checkpoints are loaded with `torch.load(weights_only=True)`: a shared checkpoint (for `play`) cannot
run code. `save` therefore refuses states holding anything but containers, scalars, strings and
tensors (numpy RNG state is stored as a tensor for that reason).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import random
import re
import socket
import tempfile
import warnings
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from fast_lora_td3.errors import CheckpointError, ConfigError

CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
"""Names of the rotating checkpoints: `ckpt_<step:012d>.pt`."""
POINTER_NAME = "latest.json"
_TMP_RE = re.compile(r"^\..+\.tmp@(.+)@(\d+)@")  # .<name>.tmp@<host>@<pid>@<random>

# fmt: off
RESUME_MUTABLE_KEYS: frozenset[str] = frozenset({
    "total_steps", "resume", "checkpoint", "run_dir", "run_name", "log_dir", "logger",
    "log_interval", "log_interval_s", "cpu_defaults", "checkpoint_interval", "keep_checkpoints",
    "save_replay", "progress", "device", "compile", "cuda_graph", "verify_compile", "export_at_end",
    "nan_check_interval", "nan_action", "eval", "experiment", "video",
})
# fmt: on
"""Config keys that may change between a run and its resume (run length, logging, device, speed
flags, evaluation schedule). Each entry is a dotted pattern that matches a contiguous run of a key's
components, with fnmatch wildcards per component: `device` ignores `device` and `env.device`, `eval`
ignores everything under `eval.`."""

_SAFE_LEAVES = (str, bytes, bytearray, int, float, bool, complex, type(None), torch.Tensor)
_SAFE_LEAVES += (torch.Size, torch.device, torch.dtype)


# -- atomic writes ------------------------------------------------------------------------------
def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: the directory entry itself must reach the disk."""
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write via `write(file)` into a same-directory temp file, fsync, and rename onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Host and pid in the name let a later run remove leftovers of writers that were killed.
    prefix = f".{path.name}.tmp@{socket.gethostname()}@{os.getpid()}@"
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """`torch.save(obj)` to `path` atomically: readers see the old file or the complete new one."""
    _atomic_write(Path(path), lambda f: torch.save(obj, f))


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda f: f.write(text.encode()))


# -- state validation / loading -----------------------------------------------------------------
def _check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise TypeError naming the first value a `weights_only` load would refuse."""
    kind = type(obj)
    if kind in _SAFE_LEAVES or isinstance(obj, torch.Tensor):  # torch.Size is a tuple: leaf
        return
    if kind in (dict, OrderedDict, Counter):
        for k, v in obj.items():
            if type(k) not in _SAFE_LEAVES:
                raise TypeError(f"{where} has a key of type {type(k).__name__}")
            _check_weights_only_safe(v, f"{where}[{k!r}]")
        return
    if kind in (list, tuple, set):
        for i, v in enumerate(obj):
            _check_weights_only_safe(v, f"{where}[{i}]")
        return
    # numpy scalars, namedtuples, DictConfig, dataclasses, Paths, defaultdicts... would need
    # arbitrary-code unpickling to load.
    raise TypeError(
        f"{where} is a {kind.__module__}.{kind.__name__}, which a weights_only torch.load "
        "refuses; store tensors, Python scalars, strings, lists, tuples or plain dicts"
    )


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    msg = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _looks_complete(path: Path) -> bool:
    """Cheap completeness check: a torch zip archive whose central directory names data.pkl."""
    try:
        with zipfile.ZipFile(path) as zf:
            return any(n.endswith("data.pkl") for n in zf.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def load_file(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, weights_only: bool = True
) -> dict[str, Any]:
    """Load one checkpoint file; CheckpointError (one line, naming the path) if missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (no such file)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as exc:  # unpickling, truncated zip, bad storage: all mean "unreadable"
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({_first_line(exc)})"
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(state).__name__}, not a training-state dict"
        )
    return state


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


# -- the manager ----------------------------------------------------------------------------------
class CheckpointManager:
    """Rotating checkpoints `ckpt_<step:012d>.pt` in `directory`, keeping the newest `keep_last`.

    Construction removes temp files left by writers on this host that were killed (their pid is
    gone); construct it before any rank starts saving.
    """

    def __init__(self, directory: str | os.PathLike[str], keep_last: int) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ConfigError(f"keep_checkpoints must be an integer >= 1, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.loaded_path: Path | None = None
        """The file the last `load()` call actually read (it may have fallen back)."""
        self._remove_stale_temps()

    def _remove_stale_temps(self) -> None:
        if not self.directory.is_dir():
            return
        host = socket.gethostname()
        for p in self.directory.iterdir():
            m = _TMP_RE.match(p.name)
            # Only this host can tell whether the writer is dead (shared file systems, multinode).
            if not m or m.group(1) != host or int(m.group(2)) == os.getpid():
                continue
            if not _pid_alive(int(m.group(2))):
                with contextlib.suppress(OSError):
                    p.unlink()

    def path_for(self, step: int) -> Path:
        """The file name a checkpoint of `step` gets."""
        return self.directory / f"ckpt_{int(step):012d}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """All rotating checkpoint files as (step, path), oldest first (complete or not)."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            m = CKPT_RE.match(p.name)
            if m and p.is_file():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write `state` as the checkpoint of `step`, point `latest.json` at it, prune old ones."""
        if isinstance(step, bool) or int(step) != step or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
        path = self.save_as(state, self.path_for(step))
        # The pointer is replaced only now, when the file it names is complete and durable.
        pointer = {"file": path.name, "step": int(step)}
        _atomic_write_text(self.directory / POINTER_NAME, json.dumps(pointer) + "\n")
        self._prune(keep=path, step=int(step))
        return path

    def save_as(self, state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
        """Atomically write `state` to an arbitrary `path` (e.g. a debug checkpoint); no rotation."""
        if not isinstance(state, dict):
            raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
        _check_weights_only_safe(state)
        path = Path(path)
        atomic_save(state, path)
        return path

    def _prune(self, keep: Path, step: int) -> None:
        # Files of a later step (an abandoned timeline after resuming an older checkpoint) are not
        # pruned here: they are overwritten as training passes them, and nothing is lost early.
        older = [p for s, p in self.checkpoints() if s < step and p != keep]
        for p in older[: max(0, len(older) - (self.keep_last - 1))]:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def _pointer_target(self) -> Path | None:
        try:
            data = json.loads((self.directory / POINTER_NAME).read_text())
            name = data["file"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(name, str) or not CKPT_RE.match(name):
            return None
        return self.directory / name

    def _candidates(self) -> list[Path]:
        """Pointer target first, then every rotating checkpoint, newest first."""
        out: list[Path] = []
        target = self._pointer_target()
        if target is not None and target.is_file():
            out.append(target)
        out += [p for _, p in reversed(self.checkpoints()) if p not in out]
        return out

    def latest(self) -> Path | None:
        """The checkpoint to resume from: the pointer's target, else the newest complete file."""
        return next((p for p in self._candidates() if _looks_complete(p)), None)

    def load(
        self,
        path: str | os.PathLike[str] | None = None,
        map_location: Any = "cpu",
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Load `path`, or (None) the latest checkpoint, falling back to older files that load.

        Raises CheckpointError (one line) when the file is missing or corrupt, or when no checkpoint
        in the directory loads. Sets `self.loaded_path`.
        """
        if path is not None:
            state = load_file(path, map_location, weights_only=weights_only)
            self.loaded_path = Path(path)
            return state
        candidates = self._candidates()
        if not candidates:
            raise CheckpointError(f"no checkpoint in {self.directory} (expected ckpt_<step>.pt)")
        errors: list[str] = []
        for cand in candidates:
            try:
                state = load_file(cand, map_location, weights_only=weights_only)
            except CheckpointError as exc:
                errors.append(str(exc))
                warnings.warn(f"{exc}; trying an older checkpoint", stacklevel=2)
                continue
            self.loaded_path = cand
            return state
        raise CheckpointError(
            f"no loadable checkpoint in {self.directory} ({len(candidates)} tried; newest: "
            f"{errors[0]})"
        )


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
    is named in the message when given.
    """
    ignore = tuple(ignore)
    saved, current = flatten_config(saved_cfg), flatten_config(current_cfg)
    diffs = []
    for key in sorted(saved.keys() | current.keys()):
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
