"""``parallel(mode=cfg+async)``: both modes at once, from their pieces. The two guidance branches run side by
side (cfg.py's branch split) and each branch's denoiser is staged (async_.py's stages): rank = branch x stages
+ stage, ``devices`` = 2 x ``stages``; its options are mode=async's.

Example (``torchrun --nproc-per-node 4 script.py``)::

    fp = FastPipeline.from_pretrained("/tmp/tiny-sd", accelerators="parallel(mode=cfg+async,devices=4)")
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from fastdiff.core.hooks import HandleGroup, all_or_nothing
from fastdiff.core.options import option
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.parallel.async_ import ParallelAsync, install_async, stage_units
from fastdiff.parallel.cfg import ParallelCfg, guidance_branches, install_branch_split
from fastdiff.parallel.group import subgroups

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

    pass


@register
@dataclasses.dataclass(frozen=True)
class ParallelCfgAsync(ParallelAsync):
    """mode=async's options over 2 guidance branches. Example: ``parallel(mode=cfg+async,devices=4)``."""

    mode: Literal["cfg+async"] = "cfg+async"
    devices: int = option(4, ge=1)

    touches = ParallelCfg.touches | ParallelAsync.touches
    exclusive = ParallelCfg.exclusive | ParallelAsync.exclusive
    branches = 2

    def apply(self, fp: FastPipeline) -> HandleGroup:
        branches, stages = guidance_branches(fp, "parallel(mode=cfg+async)"), self.stage_count()
        if self.devices != branches * stages:
            raise AcceleratorError(
                f"parallel(mode=cfg+async) runs one guidance branch per device: devices must "
                f"be {branches * stages}, got {self.devices}"
            )
        stage_units(fp.denoiser)  # an unsupported denoiser fails before the process group is looked at
        branch, stage = divmod(self.group_rank(), stages)
        ranks, stage_group = subgroups(stages, branches, by="stage")[branch]
        _, branch_group = subgroups(stages, branches, by="branch")[stage]
        with all_or_nothing([install_async(fp, self, stage, ranks, stage_group)]) as handles:
            # outside the stages' hook: it hands each stage one branch's half batch
            handles.append(install_branch_split(fp, branches, branch, branch_group))
        return HandleGroup(handles)
