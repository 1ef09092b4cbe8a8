"""Runtime accelerators that keep the weights' values: ``compile``, ``fuse`` and ``attention``.

- ``compile(mode=default|reduce-overhead|max-autotune)``: ``torch.compile`` (dynamic=False) of the denoiser. The
  denoiser's own forward carries fastdiff's Python hooks (step context, NFE counter, caches) whose counters
  dynamo would guard on and recompile for at every step, so the compiled units are the largest submodules with no
  hook in them (down/mid/up blocks of a plain model; finer pieces around other accelerators' hooks). Instances of
  one class share a compiled function, so compiles are per class and input shape, not per step or per call.
  Apply it last (it is the last kind), so other accelerators' hooks are in place when the units are chosen.
- ``fuse(qkv=true, channels_last=false)``: diffusers' fused QKV projections (``fuse_qkv_projections`` on models
  that have it, ``Attention.fuse_projections`` + ``FusedAttnProcessor2_0`` elsewhere) and optionally the
  channels_last memory format. There are no foldable norms in these denoisers: they use GroupNorm, LayerNorm and
  AdaLN, whose statistics depend on the input (only eval-mode BatchNorm folds into a convolution).
- ``attention(backend=sdpa|math|xformers)``: diffusers' attention processors ``AttnProcessor2_0`` (PyTorch SDPA),
  ``AttnProcessor`` (explicit softmax(QK^T)V) or ``XFormersAttnProcessor``; xformers falls back to SDPA with a
  warning when it is missing or has no kernel for the device.

Every ``remove()`` restores the exact previous modules, processors and tensors (bit-identical outputs).

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("fuse(channels_last=true)")  # or "attention(backend=math)", "compile"
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from diffusers.hooks import ModelHook
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor,
    AttnProcessor2_0,
    FusedAttnProcessor2_0,
    XFormersAttnProcessor,
)
from torch.utils._pytree import tree_map_only

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle, HandleGroup, all_or_nothing, install_hook
from fastdiff.core.registry import Accelerator, AcceleratorError, register

# Processors with the plain Attention semantics (norms, residual, rescale) that these accelerators may replace.
PLAIN_PROCESSORS = (AttnProcessor, AttnProcessor2_0, XFormersAttnProcessor, FusedAttnProcessor2_0)


def _has_hooks(module: torch.nn.Module) -> bool:
    registry = getattr(module, "_diffusers_hook", None)
    return registry is not None and bool(registry.hooks)


def compile_units(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The largest submodules with parameters and no diffusers hook inside them, torch.nn leaves excepted.

    A lone ``nn.Linear``/``nn.Conv2d`` gains nothing from compiling (one kernel either way), and torch's own
    forwards are traced through one shared wrapper whose recompile limit (8) many of them would exhaust.
    """
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    if not isinstance(module, containers) and not any(_has_hooks(m) for m in module.modules()):
        torch_leaf = type(module).__module__.startswith("torch.")
        return [] if torch_leaf or not any(True for _ in module.parameters()) else [("", module)]
    return [
        (f"{name}.{sub}".rstrip("."), unit)
        for name, child in module.named_children()
        for sub, unit in compile_units(child)
    ]


# Compiled graphs per class forward: every instance shape (3 block widths, CFG on/off, other image sizes)
# is one entry, and dynamo's default limit of 8 per function would silently fall back to eager beyond it.
RECOMPILE_LIMIT = 64


class _CompiledHook(ModelHook):
    """Calls a compiled version of the module's forward, with room for one graph per input shape.

    Under CUDA graphs (``reduce-overhead``, ``max-autotune``) a unit's outputs live in a pool its next replay
    overwrites, while the UNet's time embedding and skip features, and caches such as deepcache's, outlive
    it: each call starts a new graph step and hands back copies.
    """

    def __init__(self, compiled, bound: bool, cudagraphs: bool = False):
        super().__init__()
        self.compiled, self.bound, self.cudagraphs = compiled, bound, cudagraphs

    def new_forward(self, module, *args, **kwargs):
        config = torch._dynamo.config
        limit = config.recompile_limit
        config.recompile_limit = max(limit, RECOMPILE_LIMIT)  # for our calls only; restored below
        try:
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            output = self.compiled(*args, **kwargs) if self.bound else self.compiled(module, *args, **kwargs)
        finally:
            config.recompile_limit = limit
        if self.cudagraphs:
            output = tree_map_only(torch.Tensor, torch.clone, output)
        return output


@register
@dataclass(frozen=True)
class Compile(Accelerator):
    """``torch.compile`` the denoiser (dynamic=False). Example: ``fp.accelerate("compile(mode=max-autotune)")``.

    ``backend``: ``inductor`` (default, generates kernels); ``eager``/``aot_eager`` only trace (for debugging).
    The first call compiles (minutes on a busy CPU); later calls reuse it. Accelerators applied after
    ``compile`` in a separate ``accelerate`` call put their hooks inside compiled code; apply them together
    (``fp.accelerate("tome;compile")``) or remove and re-apply ``compile``.
    """

    mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    backend: Literal["inductor", "eager", "aot_eager"] = "inductor"

    spec_name = "compile"
    kind = "compile"
    touches = frozenset({"denoiser.compiled"})
    exclusive = frozenset({"denoiser.compiled"})

    def apply(self, fp) -> Handle:
        denoiser = fp.denoiser
        denoiser_facts(denoiser, "compile")
        units = compile_units(denoiser)
        if not units:
            raise AcceleratorError(
                f"compile: found no hook-free submodule with weights in {type(denoiser).__name__}"
            )
        options = {"mode": self.mode} if self.backend == "inductor" else {}
        by_function: dict = {}
        with all_or_nothing() as handles:
            for _, unit in units:
                forward = unit.forward
                function = getattr(forward, "__func__", None)
                shared = function is not None and function is type(unit).forward  # one per class
                key = function if shared else forward
                if key not in by_function:
                    by_function[key] = torch.compile(key, backend=self.backend, dynamic=False, **options)
                cudagraphs = self.backend == "inductor" and self.mode != "default"
                hook = _CompiledHook(by_function[key], bound=not shared, cudagraphs=cudagraphs)
                handles.append(install_hook(unit, hook, "fastdiff.compile"))
        return HandleGroup(handles)


def _attention_modules(denoiser: torch.nn.Module, who: str) -> list[tuple[str, Attention]]:
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


def _restore_processors(modules: list[tuple[str, Attention]]):
    saved = [(m, m.processor) for _, m in modules]

    def restore():
        for module, processor in saved:
            module.set_processor(processor)

    return restore


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

    def apply(self, fp) -> Handle:
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
        modules = _attention_modules(denoiser, "fuse")
        restore_processors = _restore_processors(modules)
        before = [(m, m.fused_projections, set(m._modules)) for _, m in modules]
        had_originals = "original_attn_processors" in denoiser.__dict__
        originals = denoiser.__dict__.get("original_attn_processors")

        def restore():
            restore_processors()
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

    def apply(self, fp) -> Handle:
        denoiser = fp.denoiser
        denoiser_facts(denoiser, "attention")
        modules = _attention_modules(denoiser, "attention")
        backend = self.backend
        if backend == "xformers":
            weight = next(denoiser.parameters())
            problem = xformers_problem(weight.device, weight.dtype)
            if problem:
                warnings.warn(f"attention(backend=xformers): {problem}; using sdpa instead", stacklevel=3)
                backend = "sdpa"
        make = {"sdpa": AttnProcessor2_0, "math": AttnProcessor, "xformers": XFormersAttnProcessor}[backend]
        restore = _restore_processors(modules)
        for _, module in modules:
            module.set_processor(make())
        return Handle(restore, backend=backend)
