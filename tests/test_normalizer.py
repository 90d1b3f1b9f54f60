"""EmpiricalNormalizer against numpy moments; freeze / until gating; state_dict; multi-rank merge."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fast_lora_td3.nn.normalizer import EmpiricalNormalizer


def batches(seed: int, sizes: list[int], dim: int = 5) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.1, 20.0, dim)
    shift = torch.linspace(-50.0, 50.0, dim)
    return [torch.randn(n, dim, generator=gen) * scale + shift for n in sizes]


def test_matches_numpy_over_many_batches() -> None:
    data = batches(0, [1, 7, 64, 3, 500, 2, 1000, 1, 33])
    norm = EmpiricalNormalizer(5)
    assert torch.equal(norm.mean, torch.zeros(5)) and torch.equal(norm.var, torch.ones(5))
    for i, x in enumerate(data):
        norm.update(x)
        seen = torch.cat(data[: i + 1]).double().numpy()
        np.testing.assert_allclose(norm.mean.numpy(), seen.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(norm.var.numpy(), seen.var(0), rtol=1e-5, atol=1e-5)
        assert norm.count.item() == len(seen)
    x = torch.randn(10, 5)
    seen = torch.cat(data).double()
    want = (x.double() - seen.mean(0)) / (seen.var(0, unbiased=False).sqrt() + 1e-2)
    torch.testing.assert_close(norm(x).double(), want, rtol=1e-5, atol=1e-5)


def test_multidim_shape_and_leading_axes() -> None:
    norm = EmpiricalNormalizer((2, 3))
    x = torch.randn(4, 6, 2, 3) * 3 + 1  # leading axes [4, 6] are flattened into samples
    norm.update(x)
    flat = x.reshape(-1, 2, 3).double()
    torch.testing.assert_close(norm.mean.double(), flat.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm.var.double(), flat.var(0, unbiased=False), rtol=1e-6, atol=1e-6)
    assert norm(x).shape == x.shape


def test_frozen_eval_and_until() -> None:
    data = batches(1, [10, 10, 10, 10])
    norm = EmpiricalNormalizer(5)
    norm.update(data[0])
    snap = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.freeze()
    norm.update(data[1])
    norm.eval()
    norm.unfreeze()
    norm.update(data[2])  # eval mode: no update either
    for k, v in norm.state_dict().items():
        if k != "frozen":
            assert torch.equal(v, snap[k]), k
    norm.train()
    norm.update(data[1])
    assert norm.count.item() == 20

    # until=15: the batch crossing the limit is merged in full, later ones are ignored.
    limited = EmpiricalNormalizer(5, until=15)
    for x in data:
        limited.update(x)
    assert limited.count.item() == 20
    seen = torch.cat(data[:2]).double()
    torch.testing.assert_close(limited.mean.double(), seen.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        limited.var.double(), seen.var(0, unbiased=False), rtol=1e-5, atol=1e-5
    )


def test_merge_stats_and_state_dict_round_trip(tmp_path) -> None:
    a, b = batches(2, [40, 25])
    norm = EmpiricalNormalizer(5, until=1000)
    norm.update(a)
    norm.merge_stats_(25, b.double().mean(0), b.double().var(0, unbiased=False))
    both = torch.cat([a, b]).double()
    torch.testing.assert_close(norm.mean.double(), both.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var.double(), both.var(0, unbiased=False), rtol=1e-5, atol=1e-5)
    norm.freeze()
    torch.save(norm.state_dict(), tmp_path / "n.pt")
    other = EmpiricalNormalizer(5, until=1000)
    other.load_state_dict(torch.load(tmp_path / "n.pt", weights_only=True))
    for k, v in norm.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    assert other.count.dtype == torch.float64 and bool(other.frozen)
    x = torch.randn(3, 5)
    assert torch.equal(other(x), norm(x))


def test_torchscript_forward() -> None:
    norm = EmpiricalNormalizer(4)
    norm.update(torch.randn(100, 4) * 2 + 3)
    scripted = torch.jit.script(norm)
    x = torch.randn(8, 4)
    torch.testing.assert_close(scripted(x), norm(x))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = batches(10 + rank, [8 + rank, 3 + 2 * rank])
        synced = EmpiricalNormalizer(5, distributed=True)
        for x in data:
            synced.update(x)
        local = EmpiricalNormalizer(5)
        for x in data:
            local.update(x)
        local.allreduce_()
        torch.save(
            {"synced": synced.state_dict(), "once": local.state_dict()}, f"{out_dir}/{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_rank_gloo_sync(tmp_path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    every = torch.cat([x for r in range(2) for x in batches(10 + r, [8 + r, 3 + 2 * r])]).double()
    for r in range(2):
        states = torch.load(tmp_path / f"{r}.pt", weights_only=True)
        for key in ("synced", "once"):
            st = states[key]
            assert st["count"].item() == len(every), (r, key)
            torch.testing.assert_close(st["mean"].double(), every.mean(0), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                st["var"].double(), every.var(0, unbiased=False), rtol=1e-5, atol=1e-5
            )
