"""``compile(mode=default|reduce-overhead|max-autotune)``: ``torch.compile`` (dynamic=False) of the denoiser.

The denoiser's own forward carries fastdiff's Python hooks (step context, NFE counter, caches) whose counters
dynamo would guard on and recompile for at every step, so the compiled units are the largest submodules with no
hook in them (down/mid/up blocks of a plain model; finer pieces around other accelerators' hooks). Instances of
one class share a compiled function, so compiles are per class and input shape, not per step or per call.
Apply it last (it is the last kind), so other accelerators' hooks are in place when the units are chosen.
``remove()`` takes the hooks off: the modules run eagerly again, bit-identical to before.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("compile")
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from diffusers.hooks import ModelHook
from torch.utils._pytree import tree_map_only

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.diffusers_compat import has_hooks
from fastdiff.core.hooks import Handle, HandleGroup, all_or_nothing, install_hook
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline


def compile_units(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The largest submodules with parameters and no diffusers hook inside them, torch.nn leaves excepted.

    A lone ``nn.Linear``/``nn.Conv2d`` gains nothing from compiling (one kernel either way), and torch's own
    forwards are traced through one shared wrapper whose recompile limit (8) many of them would exhaust.
    """
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    if not isinstance(module, containers) and not any(has_hooks(m) for m in module.modules()):
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

    def apply(self, fp: FastPipeline) -> Handle:
        denoiser = fp.denoiser
        denoiser_facts(denoiser, "compile")
        units = compile_units(denoiser)
        if not units:
            raise AcceleratorError(f"compile: found no hook-free submodule with weights in {type(denoiser).__name__}")
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
