"""Checkpoint files: atomic writes, keep-last-K rotation, the checkpoint interval, and loading with
one-line errors. What goes into a checkpoint beside the learner's tensors (RNG states, the resume
config check) is `fast_lora_td3.runs.checkpoint_state`.

Crash safety: a checkpoint is written atomically (`fast_lora_td3.runs.atomic_io`). The `latest.json`
pointer is replaced the same way, and only after the checkpoint it names is complete; older files
are pruned only after that. So a SIGKILL at any moment leaves either the previous or the new
pointer, each naming a complete file. If the pointer is missing or names a bad file, `latest()` /
`load()` fall back to the newest checkpoint file that is complete, printing one warning line per
skipped file.

Integrity: every checkpoint gets a SHA-256 sidecar `<file>.sha256` (`sha256sum` format, so
`sha256sum -c` checks it too), hashed while the file is written and made durable before the file
is renamed into place: a complete checkpoint always has its hash. Loading verifies it, so bytes
flipped on disk are found instead of trained on. Files without a sidecar (written before hashes
were recorded) load unverified.

Checkpoints are loaded with `torch.load(weights_only=True)`: a shared checkpoint (for `play`) cannot
run code. `save` therefore refuses states holding anything but containers, scalars, strings and
tensors (numpy RNG state is stored as a tensor for that reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import IO, Any

import torch

from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.runs.atomic_io import atomic_write, atomic_write_bytes, remove_stale_temps

CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
"""Names of the rotating checkpoints: `ckpt_<step:012d>.pt`."""
POINTER_NAME = "latest.json"
HASH_SUFFIX = ".sha256"
"""A checkpoint's SHA-256 sidecar is `<checkpoint name>.sha256`."""
CHECKPOINT_FILE_MODE = 0o600
"""Permission bits of checkpoint files and the pointer: owner-only, as they have always been written."""

_SAFE_LEAVES = (str, bytes, bytearray, int, float, bool, complex, type(None), torch.Tensor)
_SAFE_LEAVES += (torch.Size, torch.device, torch.dtype)


# -- atomic writes ------------------------------------------------------------------------------
class _HashingWriter:
    """A write-only file that hashes every byte on its way to `file` (torch.save writes in order)."""

    def __init__(self, file: IO[bytes], digest: Any) -> None:
        self.file, self.digest = file, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def hash_path(path: str | os.PathLike[str]) -> Path:
    """The SHA-256 sidecar of checkpoint `path`."""
    path = Path(path)
    return path.with_name(path.name + HASH_SUFFIX)


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> str:
    """`torch.save(obj)` to `path` atomically (readers see the old file or the complete new one)
    with its SHA-256 sidecar; returns the hex digest."""
    path = Path(path)
    digest = hashlib.sha256()

    def write(f: IO[bytes]) -> None:
        torch.save(obj, _HashingWriter(f, digest))
        # Durable before the checkpoint's rename: a complete checkpoint always has its hash.
        line = f"{digest.hexdigest()}  {path.name}\n".encode()
        atomic_write_bytes(hash_path(path), line, mode=CHECKPOINT_FILE_MODE)

    atomic_write(path, write, mode=CHECKPOINT_FILE_MODE)
    return digest.hexdigest()


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


def hash_mismatch(path: Path) -> str | None:
    """Why `path` fails its recorded SHA-256 (None: it matches, or no hash was recorded)."""
    try:
        recorded = hash_path(path).read_text().split()[0]
    except (OSError, IndexError):  # no sidecar: a checkpoint from before hashes were recorded
        return None
    with path.open("rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual == recorded:
        return None
    return (
        f"SHA-256 {actual[:12]}... differs from {recorded[:12]}... recorded when it was written: "
        "the file changed on disk"
    )


def corruption(path: Path) -> str | None:
    """Why checkpoint `path` cannot be used (None: complete and, if hashed, intact)."""
    if not _looks_complete(path):
        return "truncated or not a checkpoint archive"
    return hash_mismatch(path)


def warn_skipped(path: Path, reason: str) -> None:
    """The one warning line for a checkpoint passed over in favour of an older one."""
    print(
        f"fast-lora-td3: warning: skipping checkpoint {path} ({reason}); trying an older one",
        file=sys.stderr,
        flush=True,
    )


def load_file(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, weights_only: bool = True
) -> dict[str, Any]:
    """Load one checkpoint file; CheckpointError (one line, naming the path) if missing, corrupt or
    not matching its recorded SHA-256."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (no such file)")
    mismatch = hash_mismatch(path)
    if mismatch is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt ({mismatch})")
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


# -- the manager ----------------------------------------------------------------------------------
class CheckpointManager:
    """Rotating checkpoints `ckpt_<step:012d>.pt` in `directory`, keeping the newest `keep_last`;
    `interval`: training iterations between checkpoints (0: only at the end, see `due`).

    Construction removes temp files left by writers on this host that were killed (their pid is
    gone); construct it before any rank starts saving.
    """

    def __init__(
        self, directory: str | os.PathLike[str], keep_last: int, *, interval: int = 0
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ConfigError(f"keep_checkpoints must be an integer >= 1, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.interval = interval
        self.loaded_path: Path | None = None
        """The file the last `load()` call actually read (it may have fallen back)."""
        remove_stale_temps(self.directory)

    def due(self, iteration: int, *, last: bool = False) -> bool:
        """Whether a checkpoint is due after `iteration`: every `interval` iterations and at the
        `last` one."""
        return bool(self.interval and iteration % self.interval == 0) or last

    def path_for(self, step: int) -> Path:
        """The file name a checkpoint of `step` gets."""
        return self.directory / f"ckpt_{int(step):012d}.pt"

    def debug_path_for(self, iteration: int) -> Path:
        """The file of the debug checkpoint written at `iteration` (outside the rotation)."""
        return self.directory / f"debug_{iteration:012d}.pt"

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
        pointer_bytes = (json.dumps(pointer) + "\n").encode()
        atomic_write_bytes(self.directory / POINTER_NAME, pointer_bytes, mode=CHECKPOINT_FILE_MODE)
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
            with contextlib.suppress(FileNotFoundError):
                hash_path(p).unlink()

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

    def scan(self) -> tuple[Path | None, list[tuple[Path, str]]]:
        """The checkpoint to resume from (the pointer's target, else the newest file that is
        complete and matches its hash) and the newer files passed over, with why; quiet."""
        skipped = []
        for p in self._candidates():
            reason = corruption(p)
            if reason is None:
                return p, skipped
            skipped.append((p, reason))
        return None, skipped

    def latest(self) -> Path | None:
        """`scan`'s choice, with one warning line per file skipped."""
        path, skipped = self.scan()
        for p, reason in skipped:
            warn_skipped(p, reason)
        return path

    def load(
        self,
        path: str | os.PathLike[str] | None = None,
        map_location: Any = "cpu",
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Load `path`, or (None) the latest checkpoint, falling back to older files that load (one
        warning line per file skipped).

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
                warn_skipped(cand, str(exc).removeprefix(f"checkpoint {cand} "))
                continue
            self.loaded_path = cand
            return state
        raise CheckpointError(
            f"no loadable checkpoint in {self.directory} ({len(candidates)} tried; newest: "
            f"{errors[0]})"
        )
