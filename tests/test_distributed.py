"""Data-parallel training on CPU with gloo: replicas stay identical, an update equals the
single-process update on the union of the ranks' batches, only rank 0 writes, a dead rank ends the
job with a clear error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cli_helpers import NO_EXPORT as SMALL

from fast_lora_td3.algos import make_learner
from fast_lora_td3.config.compose import compose_config
from fast_lora_td3.replay.buffer import ReplaySample
from fast_lora_td3.training.distributed import DUMP_ENV, TIMEOUT_ENV, DistributedContext
from fast_lora_td3.training.update_step import UpdateStep, UpdateStepConfig

OBS, ACT, B, K = 6, 2, 16, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_learner():
    cfg = compose_config([*SMALL, "algo.policy_noise=0.0", "algo.max_grad_norm=1.0"])
    torch.manual_seed(0)
    return make_learner(cfg.algo, cfg.critic, cfg.actor, OBS, OBS, ACT, "cpu")


def batches(step: int) -> tuple[ReplaySample, torch.Tensor]:
    """The union batch of update `step` (ranks take halves) and rollout obs for the normaliser."""
    g = torch.Generator().manual_seed(100 + step)
    obs, nxt = torch.randn(B, OBS, generator=g) * 2 + 1, torch.randn(B, OBS, generator=g)
    sample = ReplaySample(
        obs=obs,
        critic_obs=obs,
        actions=torch.rand(B, ACT, generator=g) * 2 - 1,
        rewards=torch.randn(B, generator=g),
        next_obs=nxt,
        next_critic_obs=nxt,
        bootstrap=(torch.rand(B, generator=g) > 0.2).float(),
        discount=torch.full((B,), 0.97**3),
        k=torch.full((B,), 3),
    )
    return sample, torch.randn(2 * B, OBS, generator=g) * 3 - 1


def run_updates(learner, rank: int | None) -> dict[str, torch.Tensor]:
    """K normaliser updates + critic/actor updates; rank None: the single process on union data."""
    update = UpdateStep(learner, UpdateStepConfig(policy_frequency=2))  # eager, as in training
    for step in range(K):
        sample, rollout = batches(step)
        if rank is not None:
            half = slice(rank * B // 2, (rank + 1) * B // 2)
            sample = ReplaySample(*(t[half] for t in sample))
            rollout = rollout[rank * B : (rank + 1) * B]
        learner.update_normalizers(rollout, rollout)
        update(sample)
    return {
        f"{m}.{k}": v.clone()
        for m, mod in learner.modules().items()
        for k, v in mod.state_dict().items()
    }


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = DistributedContext.from_environment("cpu", timeout_s=60)
    learner = tiny_learner()
    learner.grad_sync = ctx.allreduce_grads_
    learner.obs_normalizer.distributed = learner.critic_obs_normalizer.distributed = True
    torch.save(run_updates(learner, rank), f"{out}/rank{rank}.pt")
    ctx.shutdown()


def test_two_rank_update_equals_single_process_update_on_the_union_batch(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    reference = run_updates(tiny_learner(), rank=None)
    start = {
        f"{m}.{k}": v.clone()
        for m, mod in tiny_learner().modules().items()
        for k, v in mod.state_dict().items()
    }
    for key, ref in reference.items():
        assert torch.equal(r0[key], r1[key]), f"{key} differs between ranks"
        # Mean of the halves' gradients = the union batch's gradient, and the all-reduced
        # normaliser moments = the union's moments (up to float summation order).
        assert torch.allclose(r0[key].double(), ref.double(), atol=2e-5, rtol=1e-4), key
    assert any(not torch.equal(reference[k], start[k]) for k in reference if k.startswith("actor."))
    assert not torch.equal(reference["obs_normalizer.mean"], start["obs_normalizer.mean"])
    # Without the all-reduce, rank 0's half alone gives different parameters: the test can fail.
    local = run_updates(tiny_learner(), rank=0)
    assert any(
        not torch.allclose(local[k], reference[k], atol=1e-4) for k in reference if "actor" in k
    )


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    full = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full
    )


def torchrun(nproc: int, *train_args: str, cwd: Path, dump: Path) -> subprocess.CompletedProcess:
    return cli(
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        "-m",
        "fast_lora_td3.cli",
        "train",
        *train_args,
        cwd=cwd,
        env={DUMP_ENV: str(dump)},
    )


def load_dump(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k.startswith("actor."))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["fasttd3", "fastsac"])
def test_torchrun_two_ranks_keep_identical_replicas(tmp_path: Path, algo: str) -> None:
    args = [*SMALL, f"algo={algo}", "total_steps=160", f"log_dir={tmp_path / 'logs'}"]
    res = torchrun(2, *args, cwd=tmp_path, dump=tmp_path / "dp")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "replicas in sync on 2 ranks" in res.stdout
    r0, r1 = load_dump(tmp_path / "dp" / "rank0.pt"), load_dump(tmp_path / "dp" / "rank1.pt")
    assert_same(r0, r1)
    # Only rank 0 made a run directory, and its checkpoint holds the same parameters.
    (run,) = (tmp_path / "logs" / "PointMassAsym-v0").iterdir()
    (ckpt,) = (run / "checkpoints").glob("ckpt_*.pt")
    learner_state = torch.load(ckpt, weights_only=False)["learner"]
    for key, value in r0.items():
        module, _, name = key.partition(".")
        saved = learner_state[module][name] if name else learner_state[module]
        assert torch.equal(saved, value), key
    if algo == "fastsac":  # α is trained from per-rank data: its gradient must be all-reduced too
        assert torch.equal(learner_state["log_alpha"], r0["log_alpha"])
        assert not torch.equal(r0["log_alpha"], torch.log(torch.tensor(0.001)))
    # A single process with the same seed sees half the data: its parameters differ.
    res = cli(
        "-m",
        "fast_lora_td3.cli",
        "train",
        *args,
        cwd=tmp_path,
        env={DUMP_ENV: str(tmp_path / "sp")},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert differs(r0, load_dump(tmp_path / "sp" / "rank0.pt"))


@pytest.mark.slow
def test_one_rank_torchrun_equals_the_plain_run(tmp_path: Path) -> None:
    args = [*SMALL, "total_steps=120", f"log_dir={tmp_path / 'logs'}"]
    res = torchrun(1, *args, cwd=tmp_path, dump=tmp_path / "tr")
    assert res.returncode == 0, res.stderr[-3000:]
    res = cli(
        "-m",
        "fast_lora_td3.cli",
        "train",
        *args,
        cwd=tmp_path,
        env={DUMP_ENV: str(tmp_path / "pl")},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same(load_dump(tmp_path / "tr" / "rank0.pt"), load_dump(tmp_path / "pl" / "rank0.pt"))


def srun_like_ranks(tmp_path: Path, timeout_s: int) -> list[subprocess.Popen]:
    """Two ranks started the way `srun` starts them (SLURM_* variables, no torchrun)."""
    port = str(free_port())
    args = [*SMALL, "total_steps=80000000", f"run_dir={tmp_path / 'run'}"]
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_STEP_NUM_TASKS="2",
            MASTER_PORT=port,
            **{TIMEOUT_ENV: str(timeout_s)},
        )
        env.pop("WORLD_SIZE", None)
        env.pop("RANK", None)
        cmd = [sys.executable, "-m", "fast_lora_td3.cli", "train", *args]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "metrics.jsonl").exists():  # both ranks are training
        assert time.monotonic() < deadline, procs[0].communicate(timeout=5)
        time.sleep(0.2)
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "stall"])
def test_a_failed_rank_ends_the_job_with_a_clear_error(tmp_path: Path, how: str) -> None:
    rank0, rank1 = srun_like_ranks(tmp_path, timeout_s=5)
    try:
        rank1.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        start = time.monotonic()
        _, err = rank0.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        for p in (rank0, rank1):
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert rank0.returncode == 3
    assert elapsed < 30
    last = err.strip().splitlines()[-1]
    assert last.startswith("fast-lora-td3: error: rank 0 of 2: a collective failed"), last
    assert TIMEOUT_ENV in last


def test_dry_run_builds_and_writes_nothing(tmp_path: Path) -> None:
    res = cli(
        "-m",
        "fast_lora_td3.cli",
        "train",
        *SMALL,
        "dry_run=true",
        f"log_dir={tmp_path / 'logs'}",
        cwd=tmp_path,
        env={"WORLD_SIZE": "4"},
    )
    assert res.returncode == 0, res.stderr
    assert "dry run: config valid" in res.stdout and "world_size=4" in res.stdout
    assert list(tmp_path.iterdir()) == []
    bad = cli(
        "-m", "fast_lora_td3.cli", "train", *SMALL, "critic.rank=64", "dry_run=true", cwd=tmp_path
    )
    assert bad.returncode == 2 and "critic.rank" in bad.stderr


def test_single_process_context_needs_no_process_group() -> None:
    ctx = DistributedContext(device="cpu")
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    ctx.allreduce_grads_([p])
    assert (
        torch.equal(p.grad, torch.full((3,), 2.0))
        and ctx.any_true(True)
        and not dist.is_initialized()
    )
