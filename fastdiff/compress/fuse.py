"""``fuse(qkv=true, channels_last=false)``: diffusers' fused QKV projections, and optionally channels_last.

QKV: ``fuse_qkv_projections`` on models that have it, ``Attention.fuse_projections`` + ``FusedAttnProcessor2_0``
elsewhere. There are no foldable norms in these denoisers: they use GroupNorm, LayerNorm and AdaLN, whose
statistics depend on the input (only eval-mode BatchNorm folds into a convolution). ``remove()`` restores the
exact previous modules, processors and tensors (bit-identical outputs).

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("fuse(channels_last=true)")
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from diffusers.models.attention_processor import FusedAttnProcessor2_0

from fastdiff.compress.attention import attention_modules, restore_processors
from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle, HandleGroup, all_or_nothing
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline


@register
@dataclass(frozen=True)
class Fuse(Accelerator):
    """Fuse QKV projections (diffusers) and optionally use channels_last. Example: ``fp.accelerate("fuse")``."""

    qkv: bool = True
    channels_last: bool = False

    spec_name = "fuse"
    kind = "compress"
    touches = frozenset({"denoiser.weights", "denoiser.attn_processors", "denoiser.memory_format"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.attn_processors", "denoiser.memory_format"})

    def validate(self) -> None:
        if not (self.qkv or self.channels_last):
            raise AcceleratorError("fuse: qkv=false and channels_last=false leave nothing to do; enable one")

    def apply(self, fp: FastPipeline) -> Handle:
        denoiser = fp.denoiser
        denoiser_facts(denoiser, "fuse")
        with all_or_nothing() as handles:
            if self.qkv:
                handles.append(self._fuse_qkv(denoiser))
            if self.channels_last:
                handles.append(self._channels_last(denoiser))
        return HandleGroup(handles)

    @staticmethod
    def _fuse_qkv(denoiser) -> Handle:
        modules = attention_modules(denoiser, "fuse")
        undo_processors = restore_processors(modules)
        before = [(m, m.fused_projections, set(m._modules)) for _, m in modules]
        had_originals = "original_attn_processors" in denoiser.__dict__
        originals = denoiser.__dict__.get("original_attn_processors")

        def restore():
            undo_processors()
            for module, fused, names in before:
                for name in set(module._modules) - names:  # to_qkv / to_kv / to_added_qkv
                    delattr(module, name)
                module.fused_projections = fused
            if had_originals:
                denoiser.original_attn_processors = originals
            else:
                denoiser.__dict__.pop("original_attn_processors", None)

        try:
            if hasattr(denoiser, "fuse_qkv_projections"):
                denoiser.fuse_qkv_projections()  # the model's own fusion (UNet2DConditionModel)
            else:
                for _, module in modules:
                    module.fuse_projections()
                    module.set_processor(FusedAttnProcessor2_0())
        except BaseException:
            restore()
            raise
        return Handle(restore)

    @staticmethod
    def _channels_last(denoiser) -> Handle:
        saved = [(t, t.data) for t in list(denoiser.parameters()) + list(denoiser.buffers()) if t.dim() == 4]
        for tensor, data in saved:
            tensor.data = data.contiguous(memory_format=torch.channels_last)

        def restore():
            for tensor, data in saved:
                tensor.data = data  # the original storage, so values and strides are exactly as before

        return Handle(restore)
