"""``parallel(mode=cfg+ulysses)``: the guidance branches side by side (cfg.py, cfg_separate.py) and each branch's
token sequence split over its own ranks (sequence.py's Ulysses, through diffusers' context parallelism on a
sub-mesh): rank = branch x (devices / branches) + sequence rank.

Example (``torchrun --nproc-per-node 4 script.py``)::

    fp = FastPipeline.from_pretrained("/tmp/tiny-wan", accelerators="parallel(mode=cfg+ulysses,devices=4)")
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from torch.distributed.device_mesh import init_device_mesh

from fastdiff.core.hooks import HandleGroup, all_or_nothing
from fastdiff.core.options import option
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.parallel.cfg import ParallelCfg, branch_count, install_branch_split
from fastdiff.parallel.sequence import ParallelUlysses, SequenceParallelConfig

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

    pass


@register
@dataclasses.dataclass(frozen=True)
class ParallelCfgUlysses(SequenceParallelConfig):
    """One guidance branch per group of ranks, its tokens split over the group (Ulysses).
    Example: ``parallel(mode=cfg+ulysses,devices=4)``."""

    mode: Literal["cfg+ulysses"] = "cfg+ulysses"
    devices: int = option(4, ge=1)

    touches = ParallelCfg.touches | ParallelUlysses.touches
    exclusive = ParallelCfg.exclusive | ParallelUlysses.exclusive

    def context_parallel_options(self) -> dict:
        return {"ulysses_anything": True}

    def apply(self, fp: FastPipeline) -> HandleGroup:
        where = "parallel(mode=cfg+ulysses)"
        branches = branch_count(fp, where)
        share = self.devices // branches
        if self.devices % branches or share < 2:
            raise AcceleratorError(
                f"{where} splits each of the {branches} guidance branches over at least 2 "
                f"ranks: devices must be a multiple of {branches} and >= {2 * branches}, got "
                f"{self.devices}"
            )
        branch = self.group_rank() // share
        mesh = init_device_mesh(fp.pipe.device.type, (branches, 1, share), mesh_dim_names=("cfg", "ring", "ulysses"))
        with all_or_nothing([self.enable(fp, ulysses_degree=share, mesh=mesh["ring", "ulysses"])]) as handles:
            # outside the sequence split: each branch's ranks see that branch's batch
            handles.append(install_branch_split(fp, branches, branch, mesh["cfg"].get_group()))
        return HandleGroup(handles)
