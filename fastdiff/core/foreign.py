"""Other tools' patches on a pipeline: detecting them, and refusing accelerators they would defeat.

``refuse_foreign_patches`` runs before any accelerator applies; ``foreign_forward`` and ``adapter_layout`` let the
wrapper refuse a call when something changed under active accelerators.
"""

from __future__ import annotations

import functools

import torch

from fastdiff.core.diffusers_compat import hook_registry
from fastdiff.core.models import find_denoiser


def foreign_forward(module) -> bool:
    """Whether another tool replaced ``module.forward`` (a diffusers hook chain or a bound own method is not)."""
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    if hook_registry(module) is not None and isinstance(forward, functools.partial):
        return False
    return not (getattr(forward, "__func__", None) is type(module).forward and forward.__self__ is module)


def adapter_layout(module) -> tuple:
    """Which peft adapters sit where and which are fused: changes when LoRA is loaded, deleted, fused or unfused."""
    return tuple(
        (name, tuple(sorted(m.scaling)), tuple(getattr(m, "merged_adapters", ())))
        for name, m in module.named_modules()
        if isinstance(getattr(m, "scaling", None), dict)
    )


def _diffusers_cache_hooks(module) -> list[str]:
    """Names of diffusers' own caching hooks (pyramid attention broadcast, FasterCache, first-block cache ...)."""
    registry = hook_registry(module)
    if registry is None:
        return []
    found = []
    for name, hook in registry.hooks.items():
        origin = type(hook).__module__
        if origin.startswith("diffusers.hooks.") and any(w in origin for w in ("cache", "broadcast", "taylor")):
            found.append(name)
    return found


def refuse_foreign_patches(pipe, accelerators: list) -> None:
    """Refuse, before anything changes, to apply ``accelerators`` over another tool that would defeat them.

    Accelerate's offload hooks replace and later restore every forward (dropping fastdiff's hooks); a
    ``torch.compile``'d denoiser hides its blocks; a forward replaced by another patcher (the DeepCache
    package) or diffusers' own cache hooks would skip or reuse work behind fastdiff's caches; tomesd would
    merge tokens twice with ``tome``. Each case names the tool and what to do instead.
    """
    from fastdiff.core.registry import AcceleratorError

    if all(t.startswith(("scheduler", "call.")) for a in accelerators for t in getattr(a, "touches", ())):
        return  # samplers and call defaults install no hook that another tool could drop or defeat
    names = ", ".join(map(str, accelerators))
    modules = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
    if any(hasattr(m, "_hf_hook") for c in modules for m in c.modules()):
        raise AcceleratorError(
            f"{names}: accelerate's offload hooks (enable_model_cpu_offload / enable_sequential_cpu_offload) are "
            "on; they replace every forward and would drop fastdiff's hooks. Apply fastdiff's accelerators first, "
            "then enable offload"
        )
    _, denoiser = find_denoiser(pipe)
    if isinstance(denoiser, torch._dynamo.eval_frame.OptimizedModule) or getattr(
        denoiser, "_compiled_call_impl", None
    ):
        raise AcceleratorError(
            f"{names}: the {type(pipe).__name__}'s denoiser is already torch.compile'd by the user; use "
            "fastdiff's compile accelerator instead (it compiles around the other hooks), or compile after "
            "applying fastdiff"
        )
    for path, module in denoiser.named_modules():
        if foreign_forward(module):
            raise AcceleratorError(
                f"{names}: {type(denoiser).__name__}{'.' + path if path else ''}.forward was replaced by "
                "another tool (the DeepCache package's DeepCacheSDHelper does this); disable it first"
            )
    kinds = {a.kind for a in accelerators if hasattr(a, "kind")}
    foreign = sorted({n for m in denoiser.modules() for n in _diffusers_cache_hooks(m)})
    if foreign and "cache" in kinds:
        raise AcceleratorError(
            f"{names}: the denoiser carries diffusers cache hooks ({', '.join(foreign)}); two caches would "
            "reuse each other's stale features. Disable the diffusers cache first"
        )
    if any(type(m).__name__ == "ToMeBlock" for m in denoiser.modules()) and any(
        "denoiser.attention" in getattr(a, "touches", ()) for a in accelerators
    ):
        raise AcceleratorError(
            f"{names}: tomesd is applied to this pipeline (tomesd.apply_patch); token merging twice is refused. "
            "Call tomesd.remove_patch first"
        )
