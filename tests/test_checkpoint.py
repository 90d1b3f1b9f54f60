"""Atomic checkpoints, rotation, corruption handling, SIGKILL safety, RNG and config checks."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fast_lora_td3.errors import CheckpointError, ConfigError
from fast_lora_td3.runs.atomic_io import atomic_write, atomic_write_bytes
from fast_lora_td3.runs.checkpoint import POINTER_NAME, CheckpointManager, atomic_save
from fast_lora_td3.runs.checkpoint_state import check_compatible, rng_state, set_rng_state


def _state(step: int) -> dict:
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 5)).square().sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "step": step,
        "config": {"algo": {"gamma": 0.99, "dims": [1, 2]}, "name": "x", "none": None},
        "rng": rng_state(),
    }


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ck", keep_last=2)
    state = _state(7)
    path = mgr.save(state, 7)
    assert path.name == "ckpt_000000000007.pt"
    assert mgr.latest() == path
    assert json.loads((tmp_path / "ck" / POINTER_NAME).read_text())["step"] == 7
    _assert_same(state, mgr.load())
    assert mgr.loaded_path == path
    _assert_same(state, mgr.load(path, map_location="cpu"))
    assert not [p for p in (tmp_path / "ck").iterdir() if ".tmp@" in p.name]


def test_keep_last_pruning(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    for step in range(0, 600, 100):
        mgr.save({"step": step}, step)
    assert [s for s, _ in mgr.checkpoints()] == [300, 400, 500]
    one = CheckpointManager(tmp_path / "one", keep_last=1)
    for step in (1, 2, 3):
        one.save({"step": step}, step)
    assert [s for s, _ in one.checkpoints()] == [3]
    assert one.load()["step"] == 3


def test_resuming_an_older_checkpoint_moves_latest_back(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (100, 200, 300):
        mgr.save({"step": step}, step)
    path = mgr.save({"step": 150}, 150)  # a resume from an older checkpoint, then a save
    assert mgr.latest() == path and mgr.load()["step"] == 150
    assert [s for s, _ in mgr.checkpoints()] == [150, 200, 300]  # nothing newer is deleted


def test_stale_temp_files_of_dead_local_writers_are_removed(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead = int(proc.stdout)
    host = socket.gethostname()
    stale = tmp_path / f".ckpt_000000000001.pt.tmp@{host}@{dead}@abc123"
    alive = tmp_path / f".ckpt_000000000002.pt.tmp@{host}@{os.getppid()}@abc123"
    remote = tmp_path / f".ckpt_000000000003.pt.tmp@not-{host}@{dead}@abc123"
    for p in (stale, alive, remote):
        p.write_bytes(b"partial")
    CheckpointManager(tmp_path, keep_last=1)
    assert not stale.exists() and alive.exists() and remote.exists()


def test_keep_last_invalid() -> None:
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        CheckpointManager("unused", keep_last=0)


def test_unsafe_state_is_refused_at_save(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2)
    with pytest.raises(TypeError, match=r"state\['metrics'\]\['r'\] is a numpy.float64"):
        mgr.save({"metrics": {"r": np.float64(1.0)}}, 1)
    assert mgr.checkpoints() == [] and not list(tmp_path.iterdir())


def test_atomic_save_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    atomic_save({"a": torch.ones(3)}, path)
    with pytest.raises(Exception):  # noqa: B017 - a lambda cannot be pickled: any pickling error
        atomic_save({"f": lambda: 0}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pt", "x.pt.sha256"]
    CheckpointManager(tmp_path, keep_last=1).load(path)  # the old sidecar still matches


def _flip_tensor_bytes(path: Path, tensor: torch.Tensor) -> None:
    """Flip one byte inside `tensor`'s stored data (the zip and its pickle stay valid)."""
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes())
    assert at > 0
    data[at + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_sha256_recorded_and_flipped_tensor_bytes_detected(tmp_path: Path, capsys) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    marker = torch.arange(4096, dtype=torch.float32)
    good = mgr.save({**_state(1), "marker": marker}, 1)
    bad = mgr.save({**_state(2), "marker": marker}, 2)
    recorded, name = Path(f"{bad}.sha256").read_text().split()
    assert name == bad.name and recorded == hashlib.sha256(bad.read_bytes()).hexdigest()
    _flip_tensor_bytes(bad, marker)
    assert not torch.equal(torch.load(bad, weights_only=True)["marker"], marker)  # loads fine
    with pytest.raises(CheckpointError) as info:
        mgr.load(bad)
    msg = str(info.value)
    assert "\n" not in msg and str(bad) in msg and "SHA-256" in msg
    # Resuming: one warning line naming the skipped file and why, then the previous checkpoint.
    capsys.readouterr()
    assert mgr.latest() == good
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "SHA-256" in err[0], err
    assert mgr.load()["step"] == 1 and mgr.loaded_path == good
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "SHA-256" in err[0], err


def test_pruning_removes_hash_sidecars(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(_state(step), step)
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == [
        "ckpt_000000000002.pt.sha256",
        "ckpt_000000000003.pt.sha256",
    ]


def test_atomic_write_modes_and_failure(tmp_path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    plain = tmp_path / "sub" / "plain.json"  # the parent is created
    atomic_write_bytes(plain, b"one")
    assert plain.read_bytes() == b"one"
    assert plain.stat().st_mode & 0o777 == 0o666 & ~umask  # what open() would have given
    atomic_write_bytes(plain, b"two", mode=0o600)
    assert plain.read_bytes() == b"two" and plain.stat().st_mode & 0o777 == 0o600

    def fail_midway(f) -> None:
        f.write(b"partial")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        atomic_write(plain, fail_midway)
    assert plain.read_bytes() == b"two" and [p.name for p in plain.parent.iterdir()] == [
        "plain.json"
    ]


def test_checkpoint_files_stay_owner_only(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1)
    path = mgr.save({"step": 1}, 1)
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / POINTER_NAME).stat().st_mode & 0o777 == 0o600


def test_checkpoint_interval_decides_when_to_save(tmp_path: Path) -> None:
    every3 = CheckpointManager(tmp_path, keep_last=1, interval=3)
    assert [i for i in range(1, 11) if every3.due(i)] == [3, 6, 9]
    assert every3.due(10, last=True)
    at_end = CheckpointManager(tmp_path, keep_last=1)  # interval 0: only the last iteration
    assert not any(at_end.due(i) for i in range(1, 11)) and at_end.due(10, last=True)
    assert at_end.debug_path_for(12) == tmp_path / "debug_000000000012.pt"


@pytest.mark.parametrize("kind", ["truncated", "garbage", "empty"])
def test_corrupt_file_gives_one_line_error(tmp_path: Path, kind: str, capsys) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    good = mgr.save(_state(1), 1)
    bad = mgr.save(_state(2), 2)
    data = bad.read_bytes()
    bad.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[kind]
    )
    with pytest.raises(CheckpointError) as info:
        mgr.load(bad)
    msg = str(info.value)
    assert "\n" not in msg and str(bad) in msg and "corrupt" in msg
    # Without a path: the pointer names the bad file, so loading falls back to the older one,
    # saying so in one line that names the skipped file and why.
    capsys.readouterr()
    assert mgr.latest() == good
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "trying an older" in err[0], err
    assert mgr.load()["step"] == 1
    assert mgr.loaded_path == good
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "corrupt" in err[0], err


def test_missing_and_empty(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "none", keep_last=2)
    assert mgr.latest() is None
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        mgr.load()
    with pytest.raises(CheckpointError, match=r"checkpoint not found: .*nope\.pt"):
        mgr.load(tmp_path / "nope.pt")
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "ckpt_000000000005.pt").write_bytes(b"junk")
    with (
        pytest.raises(CheckpointError, match="no loadable checkpoint") as info,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        CheckpointManager(tmp_path / "only", keep_last=2).load()
    assert "\n" not in str(info.value)


def test_not_a_dict(tmp_path: Path) -> None:
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="not a training-state dict"):
        CheckpointManager(tmp_path, keep_last=1).load(tmp_path / "list.pt")


_WRITER = textwrap.dedent(
    """
    import sys, torch
    from fast_lora_td3.runs.checkpoint import CheckpointManager
    mgr = CheckpointManager(sys.argv[1], keep_last=2)
    step = 0
    if mgr.latest() is not None:
        step = mgr.load()["step"]
    n = int(sys.argv[2])
    while True:
        step += 1
        payload = torch.full((n,), float(step))
        mgr.save({"step": step, "payload": payload, "tail": torch.tensor([step])}, step)
        print(step, flush=True)
    """
)


def test_sigkill_while_writing_never_corrupts_latest(tmp_path: Path) -> None:
    directory = tmp_path / "ckpts"
    rng = random.Random(0)
    saw_partial_write = False
    last_step = 0
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(directory), str(4_000_000)],  # 16 MB payload
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # one save has completed: now it is mid-loop
        assert first.strip(), "writer subprocess failed to start"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        leftovers = [p for p in directory.iterdir() if ".tmp@" in p.name]
        saw_partial_write |= bool(leftovers)
        mgr = CheckpointManager(directory, keep_last=2)  # removes the dead writer's temp files
        assert not [p for p in directory.iterdir() if ".tmp@" in p.name]
        latest = mgr.latest()
        assert latest is not None
        # Stronger than "latest loads": the pointer itself names the latest file, and no file
        # under a final name is partial (fallbacks must never be needed).
        pointer = json.loads((directory / POINTER_NAME).read_text())
        assert latest.name == pointer["file"]
        for step, path in mgr.checkpoints():
            state = mgr.load(path)
            assert state["step"] == step and int(state["tail"]) == step
            assert state["payload"].shape == (4_000_000,) and bool((state["payload"] == step).all())
        assert pointer["step"] == mgr.load()["step"] >= last_step
        last_step = pointer["step"]
    # The kills must really have interrupted writes, or the test proves nothing.
    assert saw_partial_write


def test_rng_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    np.random.normal()  # leaves a cached gaussian in numpy's legacy state
    saved = rng_state()
    first = (torch.rand(5), np.random.normal(size=5), [random.random() for _ in range(5)])
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save({"rng": saved}, 1)  # also checks the RNG state survives a weights_only load
    set_rng_state(mgr.load()["rng"])
    second = (torch.rand(5), np.random.normal(size=5), [random.random() for _ in range(5)])
    assert torch.equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert first[2] == second[2]
    with pytest.raises(CheckpointError, match="lacks numpy"):
        set_rng_state({"torch": saved["torch"], "python": saved["python"]})


def test_config_mismatch_names_keys() -> None:
    saved = {
        "algo": {"gamma": 0.99, "lr": 3e-4},
        "critic": {"rank": 32, "layers": ["blocks"]},
        "total_steps": 1000,
        "env": {"device": "cpu", "num_envs": 16},
        "eval": {"interval": 10},
        "seed": 1,
    }
    same_but_mutable = {
        "algo": {"gamma": 0.99, "lr": 3e-4},
        "critic": {"rank": 32, "layers": ("blocks",)},
        "total_steps": 5000,
        "env": {"device": "cuda", "num_envs": 16},
        "eval": {"interval": 99},
        "seed": 1,
    }
    check_compatible(saved, same_but_mutable)
    current = {
        "algo": {"gamma": 0.98, "lr": 3e-4},
        "critic": {"rank": 64, "layers": ["blocks"], "extra": True},
        "total_steps": 1,
        "env": {"device": "cpu", "num_envs": 16},
        "eval": {"interval": 10},
        "seed": 1,
    }
    with pytest.raises(CheckpointError) as info:
        check_compatible(saved, current, source="run/ckpt_1.pt")
    msg = str(info.value)
    assert "\n" not in msg and "run/ckpt_1.pt" in msg
    assert "algo.gamma (checkpoint 0.99, now 0.98)" in msg
    assert "critic.rank (checkpoint 32, now 64)" in msg
    assert "critic.extra (checkpoint <missing>, now True)" in msg
    assert "total_steps" not in msg and "num_envs" not in msg
    # A custom ignore set replaces the default: total_steps now counts.
    with pytest.raises(CheckpointError, match="total_steps"):
        check_compatible(saved, current, ignore={"algo", "critic"})
    check_compatible(saved, current, ignore={"algo", "critic.*", "total_steps"})


def test_config_mismatch_truncates_many_keys() -> None:
    saved = {f"k{i:02d}": i for i in range(20)}
    current = {f"k{i:02d}": i + 1 for i in range(20)}
    with pytest.raises(CheckpointError) as info:
        check_compatible(saved, current)
    msg = str(info.value)
    assert "k00 (checkpoint 0, now 1)" in msg and "and 14 more" in msg and "k19" not in msg
    # The keys that show a checkpoint is another run's come first, even when many keys sorting
    # before them differ too (they were hidden in "and N more").
    saved = {"algo": {f"a{i:02d}": i for i in range(20)}, "env": {"task": "A-v0", "backend": "x"}}
    current = {"algo": {f"a{i:02d}": i + 1 for i in range(20)}, "env": {"task": "B-v0"}}
    with pytest.raises(CheckpointError) as info:
        check_compatible(saved, current)
    msg = str(info.value)
    assert "env.backend (checkpoint 'x', now <missing>); env.task (checkpoint 'A-v0'" in msg
    assert msg.index("env.task") < msg.index("algo.a00") < msg.index("and 16 more")
    long = {"a": "x" * 500}
    with pytest.raises(CheckpointError) as info:
        check_compatible(long, {"a": "y" * 500})
    assert len(str(info.value)) < 300
