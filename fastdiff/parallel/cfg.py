"""``parallel(mode=cfg)``: the two classifier-free-guidance branches on two ranks at once.

(``mode=async`` splits the denoiser into stages, async_.py; ``mode=cfg+async`` does both, cfg_async.py.)

Every rank runs the same pipeline call with the same seed (scheduler, latents and VAE stay identical on
all ranks, cheap next to the denoiser). A ``new_forward`` hook on the denoiser keeps only the rank's own
branch chunk of each batched input (rank r takes branch r of the guidance layout), runs the denoiser on half
the batch and all-gathers the halves, so every rank gets the full output and the pipeline's guidance formula
runs unchanged. Steps without guidance (batch of one branch) run whole on every rank. Pipelines that run the
branches as separate denoiser calls (Wan, Flux's true CFG) get one call per rank instead (cfg_separate.py).
The process group comes
from ``torchrun`` or ``fastdiff.parallel.launch.launch``; its timeout bounds how long a rank waits for a dead
or hung peer before the call fails with an error naming the step.

Hooks of other accelerators (deepcache, ...) sit inside this one and see one branch per rank.

Example (``torchrun --nproc-per-node 2 script.py``)::

    import torch.distributed as dist
    from fastdiff import FastPipeline

    dist.init_process_group("gloo")
    fp = FastPipeline.from_pretrained("/tmp/tiny-sd", accelerators="parallel(mode=cfg,devices=2)")
    images = fp(prompt="a red fox", guidance_scale=7.5, output_type="np").images   # same on every rank
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, install_hook
from fastdiff.core.models import PIPELINES, UnsupportedModelError, pipeline_facts
from fastdiff.core.options import option
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.core.tensors import batch_size_of, map_tensors
from fastdiff.parallel.cfg_separate import SeparateBranchHook
from fastdiff.parallel.group import ParallelConfig, gather

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK_NAME = "fastdiff.parallel-cfg"


class BranchSplitHook(ModelHook):
    """Run this rank's guidance branch only and all-gather the branches' outputs."""

    def __init__(self, context, world: int, rank: int, group=None):
        super().__init__()
        self.context, self.world, self.rank, self.group = context, world, rank, group

    def new_forward(self, module, *args, **kwargs):
        ctx, forward = self.context, self.fn_ref.original_forward
        branches, batch = ctx.branches, batch_size_of(args, kwargs)
        if not ctx.cfg or len(branches) != self.world or batch is None or batch % self.world:
            return forward(*args, **kwargs)
        chunk = batch // self.world
        lo = self.rank * chunk

        def mine(t: torch.Tensor) -> torch.Tensor:
            return t[lo : lo + chunk] if t.dim() and t.shape[0] == batch else t

        args, kwargs = map_tensors((args, kwargs), mine)
        ctx.branches = (branches[self.rank],)
        try:
            output = forward(*args, **kwargs)
        finally:
            ctx.branches = branches
        return map_tensors(output, lambda t: self._gather(t, chunk))

    def _gather(self, t: torch.Tensor, chunk: int) -> torch.Tensor:
        if not t.dim() or t.shape[0] != chunk:
            return t
        return torch.cat(gather(t, self.world, self.group, self.context))


def guidance_branches(fp, where: str) -> int:
    """The pipeline's batched guidance branches; refuses pipelines without them."""
    facts = pipeline_facts(fp.pipe)
    if len(facts.cfg_layout) < 2:
        raise UnsupportedModelError(
            f"{where} needs a pipeline with classifier-free guidance; {type(fp.pipe).__name__} has none "
            f"(supported: {', '.join(sorted(n for n, f in PIPELINES.items() if len(f.cfg_layout) > 1))})"
        )
    if facts.list_batch:
        raise UnsupportedModelError(
            f"{where} splits batched tensors by branch; {type(fp.pipe).__name__} passes "
            "its batch as lists of per-image tensors"
        )
    return len(facts.cfg_layout)


def install_branch_split(fp, branches: int, branch: int, group=None) -> Handle:
    """Hook the denoiser so that this rank runs guidance branch ``branch`` of ``branches`` (ranks in ``group``):
    its chunk of a batched guidance call, or its own call where the pipeline calls once per branch."""
    separate = len(pipeline_facts(fp.pipe).cfg_sequence) > 1
    hook = (SeparateBranchHook if separate else BranchSplitHook)(fp.context, branches, branch, group)
    return install_hook(fp.denoiser, hook, HOOK_NAME, fp.context)


def branch_count(fp, where: str) -> int:
    """Guidance branches: the separate calls of a step (cfg_separate.py), else the batched branches."""
    sequence = pipeline_facts(fp.pipe).cfg_sequence
    return len(sequence) if len(sequence) > 1 else guidance_branches(fp, where)


@register
@dataclasses.dataclass(frozen=True)
class ParallelCfg(ParallelConfig):
    """One guidance branch per rank. Example: ``parallel(mode=cfg,devices=2)``."""

    mode: Literal["cfg"] = "cfg"
    devices: int = option(2, ge=1)

    touches = frozenset({"denoiser.forward", "denoiser.batch"})
    exclusive = frozenset({"denoiser.batch"})  # cfg-interval and baked-guidance students reshape the batch

    def apply(self, fp: FastPipeline) -> Handle:
        branches = branch_count(fp, "parallel(mode=cfg)")
        if self.devices != branches:
            raise AcceleratorError(
                f"parallel(mode=cfg) runs one guidance branch per device: devices must be "
                f"{branches}, got {self.devices}"
            )
        return install_branch_split(fp, branches, self.group_rank())
