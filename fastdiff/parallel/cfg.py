"""``parallel(mode=cfg,devices=2)``: the two classifier-free-guidance branches on two ranks at once.

Every rank runs the same pipeline call with the same seed (scheduler, latents and VAE stay identical on
all ranks, cheap next to the denoiser). A ``new_forward`` hook on the denoiser keeps only the rank's own
branch chunk of each batched input (rank r takes branch r of the guidance layout), runs the denoiser on half
the batch and all-gathers the halves, so every rank gets the full output and the pipeline's guidance formula
runs unchanged. Steps without guidance (batch of one branch) run whole on every rank. The process group comes
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

import torch
import torch.distributed as dist
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, install_hook
from fastdiff.core.models import PIPELINES, UnsupportedModelError, pipeline_facts
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.core.tensors import batch_size_of, map_tensors

HOOK_NAME = "fastdiff.parallel-cfg"
MODES = ("cfg",)


class BranchSplitHook(ModelHook):
    """Run this rank's guidance branch only and all-gather the branches' outputs."""

    def __init__(self, context, world: int, rank: int):
        super().__init__()
        self.context, self.world, self.rank = context, world, rank

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
        parts = [torch.empty_like(t) for _ in range(self.world)]
        try:
            dist.all_gather(parts, t.contiguous())
        except RuntimeError as error:  # gloo: a peer died (connection closed) or hung (timeout)
            raise RuntimeError(f"parallel(mode=cfg): rank {self.rank} lost its peers at step "
                               f"{self.context.step}: {error}") from error  # fmt: skip
        return torch.cat(parts)


@register
@dataclasses.dataclass(frozen=True)
class Parallel(Accelerator):
    """Split work across the ranks of a ``torch.distributed`` group. Example: ``parallel(mode=cfg,devices=2)``."""

    mode: str = "cfg"
    devices: int = 2

    spec_name = "parallel"
    kind = "parallel"
    touches = frozenset({"denoiser.forward", "denoiser.batch"})
    exclusive = frozenset({"denoiser.batch"})  # cfg-interval or a baked-guidance student also reshape it

    def validate(self) -> None:
        if self.mode not in MODES:
            raise AcceleratorError(f"parallel: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise AcceleratorError(f"parallel: devices must be a positive integer, got {self.devices!r}")

    def apply(self, fp) -> Handle:
        facts = pipeline_facts(fp.pipe)
        if len(facts.cfg_layout) < 2:
            raise UnsupportedModelError(
                f"parallel(mode=cfg) needs a pipeline with classifier-free guidance; {type(fp.pipe).__name__} has "
                f"none (supported: {', '.join(sorted(n for n, f in PIPELINES.items() if len(f.cfg_layout) > 1))})"
            )
        if self.devices != len(facts.cfg_layout):
            raise AcceleratorError(f"parallel(mode=cfg) runs one guidance branch per device: devices must be "
                                   f"{len(facts.cfg_layout)}, got {self.devices}")  # fmt: skip
        if not dist.is_available() or not dist.is_initialized():
            raise AcceleratorError(
                f"parallel: no torch.distributed process group; start the script with `torchrun "
                f"--nproc-per-node {self.devices}` (and call dist.init_process_group), or use "
                "fastdiff.parallel.launch.launch / `fastdiff generate --devices N`"
            )
        if dist.get_world_size() != self.devices:
            raise AcceleratorError(f"parallel: devices={self.devices} but the process group has "
                                   f"{dist.get_world_size()} ranks")  # fmt: skip
        hook = BranchSplitHook(fp.context, self.devices, dist.get_rank())
        return install_hook(fp.denoiser, hook, HOOK_NAME, fp.context)
