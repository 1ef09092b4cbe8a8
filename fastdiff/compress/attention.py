"""``attention(backend=sdpa|math|xformers)``: diffusers' attention processors ``AttnProcessor2_0`` (PyTorch SDPA),
``AttnProcessor`` (explicit softmax(QK^T)V) or ``XFormersAttnProcessor``; xformers falls back to SDPA with a
warning when it is missing or has no kernel for the device. ``remove()`` restores the exact previous processors.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("attention(backend=math)")
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor,
    AttnProcessor2_0,
    FusedAttnProcessor2_0,
    XFormersAttnProcessor,
)

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

# Processors with the plain Attention semantics (norms, residual, rescale) that these accelerators may replace.
PLAIN_PROCESSORS = (AttnProcessor, AttnProcessor2_0, XFormersAttnProcessor, FusedAttnProcessor2_0)


def attention_modules(denoiser: torch.nn.Module, who: str) -> list[tuple[str, Attention]]:
    modules = [(n, m) for n, m in denoiser.named_modules() if isinstance(m, Attention)]
    if not modules:
        raise AcceleratorError(f"{who}: {type(denoiser).__name__} has no diffusers Attention layer")
    for name, module in modules:
        if not isinstance(module.processor, PLAIN_PROCESSORS):
            raise AcceleratorError(
                f"{who}: {name} uses {type(module.processor).__name__}; only the plain processors "
                f"({', '.join(p.__name__ for p in PLAIN_PROCESSORS)}) can be replaced"
            )
    return modules


def restore_processors(modules: list[tuple[str, Attention]]):
    saved = [(m, m.processor) for _, m in modules]

    def restore():
        for module, processor in saved:
            module.set_processor(processor)

    return restore


def xformers_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why xformers cannot run attention here, or None if it can (tries a tiny call)."""
    try:
        import xformers.ops
    except ImportError:
        return "xformers is not installed"
    q = torch.zeros(1, 4, 1, 8, device=device, dtype=dtype)
    try:
        xformers.ops.memory_efficient_attention(q, q, q)
    except Exception as exc:  # xformers raises NotImplementedError (and others) when no kernel fits
        return f"xformers has no kernel for {device.type} {dtype} ({type(exc).__name__})"
    return None


@register
@dataclass(frozen=True)
class AttentionBackend(Accelerator):
    """Choose the attention implementation. Example: ``fp.accelerate("attention(backend=math)")``.

    ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (flash/memory-efficient kernels where they
    exist); ``math``: diffusers' ``AttnProcessor`` (baddbmm + softmax, the reference); ``xformers``:
    ``memory_efficient_attention`` (CUDA), else SDPA with a warning.
    """

    backend: Literal["sdpa", "math", "xformers"] = "sdpa"

    spec_name = "attention"
    kind = "attention"
    touches = frozenset({"denoiser.attn_processors"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.attn_processors"})

    def apply(self, fp: FastPipeline) -> Handle:
        denoiser = fp.denoiser
        denoiser_facts(denoiser, "attention")
        modules = attention_modules(denoiser, "attention")
        backend = self.backend
        if backend == "xformers":
            weight = next(denoiser.parameters())
            problem = xformers_problem(weight.device, weight.dtype)
            if problem:
                warnings.warn(f"attention(backend=xformers): {problem}; using sdpa instead", stacklevel=3)
                backend = "sdpa"
        make = {"sdpa": AttnProcessor2_0, "math": AttnProcessor, "xformers": XFormersAttnProcessor}[backend]
        restore = restore_processors(modules)
        for _, module in modules:
            module.set_processor(make())
        return Handle(restore, backend=backend)
