"""What every ``parallel`` mode shares: the config base (one spec name, one class per ``mode``), the process
group, and sending values over it.

Each mode is a config class of its own (cfg.py, async_.py, cfg_async.py, sequence.py) registered under ``parallel`` and
picked by ``mode`` (the registry's variants); a spec without ``mode`` is ``mode=cfg``. ``FlatBroadcast`` is how
ranks send each other nested layer outputs: one flat buffer per dtype.

Example::

    import fastdiff
    fastdiff.parse("parallel(mode=async,devices=2,warmup=1)")   # [ParallelAsync(mode='async', ..., warmup=1)]
    fastdiff.parse("parallel(mode=cfg,warmup=1)")   # AcceleratorError: parallel(mode=cfg): unknown option 'warmup'
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist

from fastdiff.core.registry import Accelerator, AcceleratorError
from fastdiff.core.tensors import map_tensors, tensors_of


@dataclasses.dataclass(frozen=True)
class ParallelConfig(Accelerator):
    """Base of the ``parallel`` modes (not registered itself). Subclasses declare ``mode`` first, then
    ``devices`` and their own options."""

    spec_name = "parallel"
    kind = "parallel"
    variant_option = "mode"
    variants = ("cfg", "async", "cfg+async", "ulysses", "ring", "cfg+ulysses")

    def group_rank(self) -> int:
        """This process's rank in the process group, which must have ``devices`` ranks."""
        devices = self.devices  # type: ignore[attr-defined]  # every mode declares it
        if not dist.is_available() or not dist.is_initialized():
            raise AcceleratorError(
                f"parallel: no torch.distributed process group; start the script with `torchrun "
                f"--nproc-per-node {devices}` (and call dist.init_process_group), or use "
                "fastdiff.parallel.launch.launch / `fastdiff generate --devices N`"
            )
        if dist.get_world_size() != devices:
            raise AcceleratorError(
                f"parallel: devices={devices} but the process group has {dist.get_world_size()} ranks"
            )
        return dist.get_rank()


def subgroups(stages: int, branches: int, by: str) -> list[tuple[list[int], object]]:
    """Process groups of ranks (rank = branch x stages + stage) that differ only in their stage (``by="stage"``:
    one per branch) or only in their branch (one per stage). Every rank creates every group (torch.distributed
    requires it); a single group spanning the world is the default group (None)."""
    if by == "stage":
        sets = [[b * stages + s for s in range(stages)] for b in range(branches)]
    else:
        sets = [[b * stages + s for b in range(branches)] for s in range(stages)]
    if len(sets) == 1:
        return [(sets[0], None)]
    return [(ranks, dist.new_group(ranks)) for ranks in sets]


@contextlib.contextmanager
def peers(where: str, context):
    """Around collectives: a peer that died (connection closed) or hung (timeout) fails the call with an error
    naming this rank and the step."""
    try:
        yield
    except RuntimeError as error:
        raise RuntimeError(
            f"{where}: rank {dist.get_rank()} lost its peers at step {context.step}: {error}"
        ) from error


def gather(t: torch.Tensor, world: int, group, context, where: str = "parallel(mode=cfg)") -> list[torch.Tensor]:
    """Every rank's ``t`` (the same shape on each), in rank order; a lost peer is named with the step."""
    parts = [torch.empty_like(t) for _ in range(world)]
    with peers(where, context):
        dist.all_gather(parts, t.contiguous(), group=group)
    return parts


class FlatBroadcast:
    """``value``'s tensors broadcast from global rank ``src`` as one flat buffer per dtype.

    The sender copies its tensors in (glue code may change them in place while they are sent); the others
    receive into buffers sized from their own copy of ``value`` (same structure and shapes on every rank).
    ``async_op``: started now, finished by ``wait()``. ``received()``: ``value`` with every tensor replaced by its
    part of the received buffers (on the sender, ``value`` itself).
    """

    def __init__(self, value, src: int, group=None, async_op: bool = False):
        self.value, self.sending, self.parts = value, dist.get_rank() == src, []
        tensors = tensors_of(value)
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            mine = [t for t in tensors if t.dtype == dtype]
            if self.sending:
                flat = torch.cat([t.reshape(-1) for t in mine])
            else:
                flat = torch.empty(sum(t.numel() for t in mine), dtype=dtype, device=mine[0].device)
            work = dist.broadcast(flat, src=src, group=group, async_op=async_op)
            self.parts.append((mine, flat, work))

    def wait(self) -> FlatBroadcast:
        for _, _, work in self.parts:
            if work is not None:
                work.wait()
        return self

    def received(self):
        if self.sending:
            return self.value
        new = {}
        for mine, flat, _ in self.parts:
            new.update((id(t), part.view(t.shape)) for t, part in zip(mine, flat.split([t.numel() for t in mine])))
        return map_tensors(self.value, lambda t: new[id(t)])
