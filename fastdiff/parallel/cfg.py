"""The ``parallel`` accelerator; ``mode=cfg``: the two classifier-free-guidance branches on two ranks at once.

(``mode=async`` splits the denoiser into stages, fastdiff/parallel/async_.py; ``mode=cfg+async`` does both.)

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

from fastdiff.core.hooks import Handle, HandleGroup, install_hook
from fastdiff.core.models import PIPELINES, UnsupportedModelError, pipeline_facts
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.core.tensors import batch_size_of, map_tensors

HOOK_NAME = "fastdiff.parallel-cfg"
MODES = ("cfg", "async", "cfg+async")
DEFAULT_WARMUP = 2


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
        parts = [torch.empty_like(t) for _ in range(self.world)]
        try:
            dist.all_gather(parts, t.contiguous(), group=self.group)
        except RuntimeError as error:  # gloo: a peer died (connection closed) or hung (timeout)
            raise RuntimeError(f"parallel(mode=cfg): rank {self.rank} lost its peers at step "
                               f"{self.context.step}: {error}") from error  # fmt: skip
        return torch.cat(parts)


@register
@dataclasses.dataclass(frozen=True)
class Parallel(Accelerator):
    """Split work across the ranks of a ``torch.distributed`` group. Example: ``parallel(mode=cfg,devices=2)``.

    ``mode=cfg``: one guidance branch per rank. ``mode=async``: the denoiser in ``stages`` (default: devices)
    stages, one per rank, AsyncDiff-style (fastdiff/parallel/async_.py), after ``warmup`` whole calls, with
    activations exchanged every ``stride`` calls; the last ``cooldown`` steps run whole again (their small
    updates are where stale activations show most); ``extrapolate=1`` carries the stale activations on
    linearly to the current timestep. ``mode=cfg+async``: both, devices = branches x stages.
    """

    mode: str = "cfg"
    devices: int = 2
    stages: int | None = None
    warmup: int = DEFAULT_WARMUP
    stride: int = 1
    cooldown: int = 0
    extrapolate: int = 0

    spec_name = "parallel"
    kind = "parallel"

    @property
    def touches(self) -> frozenset[str]:  # per mode: async hooks the denoiser's layers, cfg splits its batch
        split = {"denoiser.batch"} if "cfg" in self.mode else set()
        layers = {"denoiser.blocks"} if "async" in self.mode else set()
        return frozenset({"denoiser.forward", *split, *layers})

    @property
    def exclusive(self) -> frozenset[str]:  # deepcache/blockcache (blocks), cfg-interval/students (batch)
        return self.touches - {"denoiser.forward"}

    def validate(self) -> None:
        if self.mode not in MODES:
            raise AcceleratorError(f"parallel: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.cooldown, bool) or not isinstance(self.cooldown, int) or self.cooldown < 0:
            raise AcceleratorError(f"parallel: cooldown must be an integer >= 0, got {self.cooldown!r}")
        if isinstance(self.extrapolate, bool) or self.extrapolate not in (0, 1):
            raise AcceleratorError(
                f"parallel: extrapolate must be 0 (off) or 1 (linear), got {self.extrapolate!r}"
            )
        for name in ("devices", "warmup", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AcceleratorError(f"parallel: {name} must be a positive integer, got {value!r}")
        if self.mode == "cfg":
            given = [n for n, v in (("stages", self.stages), ("warmup", self.warmup), ("stride", self.stride),
                                    ("cooldown", self.cooldown), ("extrapolate", self.extrapolate))
                     if v != {"stages": None, "warmup": DEFAULT_WARMUP, "stride": 1, "cooldown": 0,
                              "extrapolate": 0}[n]]  # fmt: skip
            if given:
                raise AcceleratorError(
                    f"parallel: {', '.join(given)} apply to mode=async and mode=cfg+async only"
                )
            return
        if self.stages is not None and (isinstance(self.stages, bool) or self.stages < 2):
            raise AcceleratorError(f"parallel: stages must be an integer >= 2, got {self.stages!r}")
        per_stage = 2 if self.mode == "cfg+async" else 1
        if self.stages is not None and self.stages * per_stage != self.devices:
            raise AcceleratorError(f"parallel(mode={self.mode}): devices must be {per_stage * self.stages} "
                                   f"(stages={self.stages}{' x 2 guidance branches' * (per_stage > 1)}), "
                                   f"got {self.devices}")  # fmt: skip
        if self.devices % per_stage:
            raise AcceleratorError(f"parallel(mode=cfg+async): devices must be even (2 guidance branches x "
                                   f"stages), got {self.devices}")  # fmt: skip
        if self.stage_count() < 2:
            raise AcceleratorError(f"parallel(mode={self.mode}) needs at least 2 stages: devices must be >= "
                                   f"{2 * per_stage}, got {self.devices}")  # fmt: skip

    def stage_count(self) -> int:
        """Stages of the denoiser (1 for mode=cfg)."""
        if self.mode == "cfg":
            return 1
        return self.stages or self.devices // (2 if self.mode == "cfg+async" else 1)

    def apply(self, fp) -> Handle:
        facts = pipeline_facts(fp.pipe)
        branches = len(facts.cfg_layout) if "cfg" in self.mode else 1
        if "cfg" in self.mode and branches < 2:
            raise UnsupportedModelError(
                f"parallel(mode={self.mode}) needs a pipeline with classifier-free guidance; {type(fp.pipe).__name__} "
                f"has none (supported: {', '.join(sorted(n for n, f in PIPELINES.items() if len(f.cfg_layout) > 1))})"
            )
        if "cfg" in self.mode and facts.list_batch:
            raise UnsupportedModelError(
                f"parallel(mode={self.mode}) splits batched tensors by branch; {type(fp.pipe).__name__} passes its "
                "batch as lists of per-image tensors"
            )
        stages = self.stage_count()
        if self.devices != branches * stages:
            raise AcceleratorError(f"parallel(mode={self.mode}) runs one guidance branch per device: devices must "
                                   f"be {branches * stages}, got {self.devices}")  # fmt: skip
        if "async" in self.mode:
            from fastdiff.parallel.async_ import stage_units

            stage_units(fp.denoiser)  # an unsupported denoiser fails before the process group is looked at
        if not dist.is_available() or not dist.is_initialized():
            raise AcceleratorError(
                f"parallel: no torch.distributed process group; start the script with `torchrun "
                f"--nproc-per-node {self.devices}` (and call dist.init_process_group), or use "
                "fastdiff.parallel.launch.launch / `fastdiff generate --devices N`"
            )
        if dist.get_world_size() != self.devices:
            raise AcceleratorError(f"parallel: devices={self.devices} but the process group has "
                                   f"{dist.get_world_size()} ranks")  # fmt: skip
        rank = dist.get_rank()
        branch, stage = divmod(rank, stages)  # rank = branch * stages + stage
        handles = []
        try:
            if "async" in self.mode:
                from fastdiff.parallel.async_ import install_async

                ranks, group = _groups(stages, branches, by="stage")[branch]
                handles.append(install_async(fp, stages, stage, ranks, group, self.warmup, self.stride,
                                             self.cooldown, self.extrapolate))  # fmt: skip
            if "cfg" in self.mode:  # outside the async hook: it hands each stage one branch's half batch
                _, group = _groups(stages, branches, by="branch")[stage]
                hook = BranchSplitHook(fp.context, branches, branch, group)
                handles.append(install_hook(fp.denoiser, hook, HOOK_NAME, fp.context))
        except BaseException:
            for handle in reversed(handles):
                handle.remove()
            raise
        return handles[0] if len(handles) == 1 else HandleGroup(handles)


def _groups(stages: int, branches: int, by: str) -> list[tuple[list[int], object]]:
    """Process groups of ranks that differ only in their stage (``by="stage"``: one per branch) or only in
    their branch (one per stage). Every rank creates every group (torch.distributed requires it); a single
    group spanning the world is the default group."""
    if by == "stage":
        sets = [[b * stages + s for s in range(stages)] for b in range(branches)]
    else:
        sets = [[b * stages + s for b in range(branches)] for s in range(stages)]
    if len(sets) == 1:
        return [(sets[0], None)]
    return [(ranks, dist.new_group(ranks)) for ranks in sets]
