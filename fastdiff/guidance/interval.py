"""Guidance interval: classifier-free guidance only inside a window of the trajectory.

Kynkaanniemi et al. 2024 ("Applying guidance in a limited interval improves sample and distribution quality
in diffusion models") find guidance harmful at the highest noise levels (it collapses diversity) and
unnecessary at the lowest. ``cfg-interval(start, end)`` guides only while ``fp.context.progress`` (fraction of
the steps done) is in ``[start, end)``. Outside the window a ``new_forward`` hook on the denoiser keeps only
the conditional chunk of every batch-first input (sample, text embeddings, class labels, added conditioning,
batched timesteps), sets ``context.branches = ("cond",)`` for the hooks inside it, runs the denoiser on half
the batch, and returns the output repeated to the full batch, so the pipeline's guidance formula
``uncond + s * (cond - uncond)`` gives the conditional prediction. NFE is unchanged (one call per step); the
cost of a step outside the window halves.

The defaults (0, 1) change nothing. Recommended: ``start=0.2,end=0.8`` (guidance in the middle, as in the
paper) or ``start=0.0,end=0.5`` for speed; measure on your model (``benchmarks/step_reuse.py``).

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    fp.accelerate("cfg-interval(start=0.2,end=0.8)")
    images = fp(prompt="a red fox", num_inference_steps=10, guidance_scale=7.5, output_type="np").images
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, install_hook
from fastdiff.core.models import PIPELINES, UnsupportedModelError, pipeline_facts
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.core.tensors import batch_size_of, map_tensors

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK_NAME = "fastdiff.cfg-interval"


class CFGIntervalHook(ModelHook):
    """Outside the window, run only the conditional chunk and repeat its output for every branch."""

    def __init__(self, context, start: float, end: float):
        super().__init__()
        self.context, self.start, self.end = context, start, end
        self.cond = (None, None)  # ((call, step), output) of the last separate cond call

    def new_forward(self, module, *args, **kwargs):
        ctx = self.context
        forward = self.fn_ref.original_forward
        branches = ctx.branches
        batch = batch_size_of(args, kwargs)
        guided = self.start <= ctx.progress < self.end
        if ctx.cfg_sequence and len(branches) == 1:  # guidance branches as separate calls
            when = (ctx.call_index, ctx.step)
            if not guided and branches == ("uncond",) and self.cond[0] == when:
                return self.cond[1]
            output = forward(*args, **kwargs)
            self.cond = (when, output) if branches == ("cond",) else (None, None)
            return output
        if guided or not ctx.cfg or "cond" not in branches or len(branches) < 2 or batch is None:
            return forward(*args, **kwargs)
        if batch % len(branches):
            return forward(*args, **kwargs)
        chunk = batch // len(branches)
        lo = branches.index("cond") * chunk

        def take_cond(t: torch.Tensor) -> torch.Tensor:
            return t[lo : lo + chunk] if t.dim() and t.shape[0] == batch else t

        def repeat(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t] * len(branches)) if t.dim() and t.shape[0] == chunk else t

        listed = _tensor_list(args[0] if args else None)  # Z-Image passes its batch as per-image lists

        def cut(value):
            # A listed batch's lists hold one tensor per image: take the cond images' entries whole (their own
            # first dimension is channels or tokens, which may equal the batch by chance). ControlNet residuals
            # are lists too, but of levels of batch-first tensors: only a listed batch is cut by entries.
            if listed and _tensor_list(value) and len(value) == batch:
                return value[lo : lo + chunk]
            return map_tensors(value, take_cond)

        args, kwargs = tuple(map(cut, args)), {k: cut(v) for k, v in kwargs.items()}
        ctx.branches = ("cond",)
        try:
            output = forward(*args, **kwargs)
        finally:
            ctx.branches = branches
        if _tensor_list(output) and len(output) == chunk:
            return output * len(branches)
        if isinstance(output, tuple) and output and _tensor_list(output[0]) and len(output[0]) == chunk:
            return (output[0] * len(branches), *output[1:])
        return map_tensors(output, repeat)


def _tensor_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


@register
@dataclasses.dataclass(frozen=True)
class CFGInterval(Accelerator):
    """Guidance only for ``start <= progress < end`` (fractions of the steps); conditional branch elsewhere.

    Example: ``fp.accelerate("cfg-interval(start=0.2,end=0.8)")``.
    """

    start: float = option(0.0, ge=0, le=1)
    end: float = option(1.0, ge=0, le=1)

    spec_name = "cfg-interval"
    kind = "guidance"
    touches = frozenset({"denoiser.forward", "denoiser.batch"})
    runs_on_xla = True
    conflicts_with = frozenset({"cfg-interval"})  # one window per pipeline

    def validate(self) -> None:
        if self.start > self.end:
            raise AcceleratorError(f"cfg-interval: start ({self.start}) must be <= end ({self.end})")

    def apply(self, fp: FastPipeline) -> Handle:
        facts = pipeline_facts(fp.pipe)
        if "cond" not in facts.cfg_layout + facts.cfg_sequence:
            guided = sorted(n for n, f in PIPELINES.items() if "cond" in f.cfg_layout + f.cfg_sequence)
            raise UnsupportedModelError(
                f"cfg-interval needs a pipeline with classifier-free guidance; {type(fp.pipe).__name__} has "
                f"none (supported: {', '.join(guided)})"
            )
        return install_hook(fp.denoiser, CFGIntervalHook(fp.context, self.start, self.end), HOOK_NAME, fp.context)
