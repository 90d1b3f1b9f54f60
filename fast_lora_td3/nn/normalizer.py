"""Running observation normaliser: `y = (x − μ)/(σ + eps)` with parallel-merged moments."""

# No `from __future__ import annotations`: TorchScript must see real annotation objects (export).
import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["EmpiricalNormalizer"]


class EmpiricalNormalizer(nn.Module):
    """Per-feature running mean / population variance, merged batch by batch (Chan et al.).

    * `forward(x)` only normalises: `(x − mean)/(sqrt(var) + eps)` (eps = 1e-2 as in FastTD3, added
      to σ, not inside the square root). It never updates, so it exports cleanly (ONNX/TorchScript).
    * `update(x)` merges the batch statistics of `x` (`[..., *shape]`, leading axes flattened) when the
      module is in training mode, not frozen, and fewer than `until` samples have been seen. The gate
      is computed on device with `torch.where` (no host sync). A batch that crosses `until` is merged
      in full; later batches are ignored. Feed it rollout observations only, never replay samples.
    * `distributed=True` all-reduces each batch's moments over the default (or given) process group
      before merging, so every rank holds identical global statistics.

    Buffers: `mean`, `var` (fp32, `shape`), `count` (fp64 0-d, samples merged), `frozen` (bool 0-d).
    Before any update, mean = 0 and var = 1. Variance is the population variance (ddof = 0).
    """

    mean: Tensor
    var: Tensor
    count: Tensor
    frozen: Tensor

    def __init__(
        self,
        shape: int | tuple[int, ...] | torch.Size,
        eps: float = 1e-2,
        until: int | None = None,
        *,
        distributed: bool = False,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.shape = torch.Size((shape,) if isinstance(shape, int) else tuple(shape))
        self.eps = float(eps)
        self.until = None if until is None else int(until)
        self.distributed = distributed
        self.group = group
        self.register_buffer("mean", torch.zeros(self.shape))
        self.register_buffer("var", torch.ones(self.shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("frozen", torch.zeros((), dtype=torch.bool))

    @property
    def std(self) -> Tensor:
        """Running standard deviation σ = sqrt(var)."""
        return self.var.sqrt()

    def forward(self, x: Tensor) -> Tensor:
        """Normalise `x` (`[..., *shape]`) in its own dtype."""
        return (x - self.mean.to(x.dtype)) / (self.var.sqrt().to(x.dtype) + self.eps)

    def freeze(self) -> None:
        """Stop merging statistics (until `unfreeze`)."""
        self.frozen.fill_(True)

    def unfreeze(self) -> None:
        """Resume merging statistics (the `until` limit still applies)."""
        self.frozen.fill_(False)

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge the statistics of a batch `x` (`[..., *shape]`) when training, not frozen, and
        below `until`; no host synchronisation."""
        if not self.training:
            return
        flat = x.detach().reshape(-1, *self.shape).to(torch.float64)
        n = torch.full((), flat.shape[0], dtype=torch.float64, device=flat.device)
        total = flat.sum(0)
        sumsq = flat.square().sum(0)
        if self.distributed and dist.is_available() and dist.is_initialized():
            # One flat bucket: [n, Σx, Σx²] summed over ranks → identical global moments everywhere.
            packed = torch.cat([n.reshape(1), total.reshape(-1), sumsq.reshape(-1)])
            dist.all_reduce(packed, group=self.group)
            n = packed[0]
            total, sumsq = packed[1:].reshape(2, *self.shape).unbind(0)
        batch_mean = total / n
        batch_var = (sumsq / n - batch_mean.square()).clamp_min(0.0)
        self._merge(n, batch_mean, batch_var)

    @torch.no_grad()
    def merge_stats_(self, count: Tensor | float, mean: Tensor, var: Tensor) -> None:
        """Merge external statistics (count samples with this mean and population variance),
        regardless of training mode but respecting `frozen` and `until`."""
        device = self.mean.device
        self._merge(
            torch.as_tensor(count, dtype=torch.float64, device=device),
            mean.to(device=device, dtype=torch.float64),
            var.to(device=device, dtype=torch.float64),
        )

    @torch.no_grad()
    def allreduce_(self, group: dist.ProcessGroup | None = None) -> None:
        """Replace the local statistics by the union of every rank's statistics (sum of counts,
        Σ count·mean, Σ count·(var + mean²)). Call it once on statistics gathered independently
        (e.g. after a local warm-up); on already-identical statistics it would multiply `count` by
        the world size. For continuous syncing construct with `distributed=True` instead.
        No-op when torch.distributed is not initialised."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        mean = self.mean.double()
        packed = torch.cat(
            [
                self.count.reshape(1),
                (self.count * mean).reshape(-1),
                (self.count * (self.var.double() + mean.square())).reshape(-1),
            ]
        )
        dist.all_reduce(packed, group=group if group is not None else self.group)
        count = packed[0]
        safe = count.clamp_min(1.0)
        new_mean = packed[1:].reshape(2, *self.shape)[0] / safe
        new_var = (packed[1:].reshape(2, *self.shape)[1] / safe - new_mean.square()).clamp_min(0.0)
        has = count > 0
        self.mean.copy_(torch.where(has, new_mean, self.mean.double()))
        self.var.copy_(torch.where(has, new_var, self.var.double()))
        self.count.copy_(count)

    def _merge(self, n: Tensor, batch_mean: Tensor, batch_var: Tensor) -> None:
        """Chan et al. parallel merge of (count, mean, M2), gated on device by `frozen`/`until`."""
        active = ~self.frozen
        if self.until is not None:
            active = active & (self.count < self.until)
        active = active & (n > 0)
        old_n = self.count
        old_mean = self.mean.double()
        tot = old_n + n
        frac = n / tot.clamp_min(1.0)
        delta = batch_mean - old_mean
        new_mean = old_mean + delta * frac
        m2 = self.var.double() * old_n + batch_var * n + delta.square() * old_n * frac
        new_var = m2 / tot.clamp_min(1.0)
        self.mean.copy_(torch.where(active, new_mean, old_mean))
        self.var.copy_(torch.where(active, new_var, self.var.double()))
        self.count.copy_(torch.where(active, tot, old_n))

    def extra_repr(self) -> str:
        return f"shape={tuple(self.shape)}, eps={self.eps}, until={self.until}"
