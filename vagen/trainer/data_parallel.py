"""Data parallelism over torch.distributed for the update: which rows a replica trains, and the sums that make N
replicas take the step one process would.

Every replica holds the whole kept batch and the same weights. No-grad scoring (old and reference log-probs,
old values) is split by rows and summed; in each optimizer step every replica back-propagates its rows of the
mini-batch, weighted by their share of the *whole* mini-batch (`aggregation_share`), and the gradients are
summed across replicas before clipping. The sum of the shares is the single-process loss, so the step is the
single-process step up to float summation order.

Why not the `DistributedDataParallel` wrapper: it averages gradients (our shares must add up, not average), and
it needs every replica to run the same number of backward passes, while a replica's rows are whole dialogues
of different lengths and a mini-batch smaller than the worker count leaves some replicas with none. The
gradient all-reduce below is what DDP does at the end of backward, once per optimizer step, in buckets. FSDP
is not needed at the sizes we train (a 3B policy with its AdamW states fits one 80 GB GPU; see the memory plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BUCKET_ELEMENTS = 1 << 25  # gradient elements per all-reduce (128 MB in fp32), as DDP's buckets


@dataclass(frozen=True)
class DataParallel:
    """This replica's place among `world` data-parallel replicas; world 1 is the single process (no-ops)."""

    rank: int = 0
    world: int = 1

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This replica's rows of `rows` (K,) int64: every `world`-th one from `rank` (balanced, order kept)."""
        return rows[self.rank :: self.world]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over replicas in place (each replica filled its own rows, zeros elsewhere)."""
        if self.world == 1:
            return tensor
        if torch.distributed.get_backend() == "nccl" and not tensor.is_cuda:  # nccl reduces GPU memory only
            on_gpu = tensor.cuda()
            torch.distributed.all_reduce(on_gpu, op=torch.distributed.ReduceOp.SUM)
            return tensor.copy_(on_gpu.cpu())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def sum_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replace each `.grad` by its sum over replicas. A parameter no replica gave a gradient keeps `None`, as in
        one process (AdamW then leaves it alone; a zero gradient would still move it through its moments)."""
        if self.world == 1 or not parameters:
            return
        has_grad = torch.tensor([float(p.grad is not None) for p in parameters], device=parameters[0].device)
        self.sum_(has_grad)
        for bucket in _buckets(parameters):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
            self.sum_(flat)
            offset = 0
            for p in bucket:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        for parameter, count in zip(parameters, has_grad.tolist(), strict=True):
            if count == 0:
                parameter.grad = None


def _buckets(parameters: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Consecutive runs of parameters with one dtype and device, at most `BUCKET_ELEMENTS` each (or one tensor)."""
    buckets: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in parameters:
        fits = buckets and size + p.numel() <= BUCKET_ELEMENTS
        if fits and (buckets[-1][0].dtype, buckets[-1][0].device) == (p.dtype, p.device):
            buckets[-1].append(p)
            size += p.numel()
        else:
            buckets.append([p])
            size = p.numel()
    return buckets
