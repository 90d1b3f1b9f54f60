"""The one atomic file writer (checkpoints, replay snapshots, exported policies, metrics repair).

A file is written to a temp file in the same directory, flushed, fsynced and renamed over the final
name with `os.replace` (atomic on POSIX), then the directory is fsynced: readers, and a machine that
loses power, see either the old file or the complete new one, never a partial file. Temp names carry
host and pid (`.<name>.tmp@<host>@<pid>@<random>`) so a later run can remove the leftovers of
writers that were killed (`remove_stale_temps`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

TEMP_NAME_RE = re.compile(r"^\..+\.tmp@(.+)@(\d+)@")
"""Temp files of `atomic_write`: `.<name>.tmp@<host>@<pid>@<random>`; groups: host, pid."""


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: the directory entry itself must reach the disk."""
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(path: Path, mode: int) -> tuple[int, Path]:
    """Create a new temp file beside `path` (exclusive create, permission bits `mode` − umask)."""
    # Host and pid in the name let a later run remove leftovers of writers that were killed.
    prefix = f".{path.name}.tmp@{socket.gethostname()}@{os.getpid()}@"
    while True:
        tmp = path.with_name(prefix + secrets.token_hex(4))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), tmp
        except FileExistsError:  # a random name already taken: draw another
            continue


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[IO[bytes]], None], *, mode: int = 0o666
) -> None:
    """Write via `write(file)` into a same-directory temp file, fsync, and rename onto `path`.

    `mode`: permission bits of the new file before the umask (0o666: what `open()` gives). The
    parent directory is created if missing. On any error the temp file is removed and `path` is
    left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _open_temp(path, mode)
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
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o666) -> None:
    """`atomic_write` of a bytes payload."""
    atomic_write(path, lambda f: f.write(data), mode=mode)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(directory: str | os.PathLike[str]) -> None:
    """Delete temp files in `directory` left by `atomic_write` calls of dead processes on this host.

    Only this host can tell whether a writer is dead (shared file systems, multinode): temp files
    of other hosts, of live processes and of this process are kept.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    host = socket.gethostname()
    for p in directory.iterdir():
        m = TEMP_NAME_RE.match(p.name)
        if not m or m.group(1) != host or int(m.group(2)) == os.getpid():
            continue
        if not _pid_alive(int(m.group(2))):
            with contextlib.suppress(OSError):
                p.unlink()
