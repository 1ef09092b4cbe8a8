"""Every private diffusers internal fastdiff uses, in one place, with the diffusers versions it was checked on.

fastdiff builds on diffusers' public hook API (``ModelHook``, ``HookRegistry``). A few things it needs are
private, and they are reached only through this module:

- where a module keeps its hook registry (``module._diffusers_hook``), the registry's hook order
  (``registry._hook_order``, innermost first) and the partial its chain puts on ``module.forward``;
- the flag that marks a hook as stateful, so ``reset_stateful_hooks`` resets it (``ModelHook._is_stateful``);
- the transformer-block metadata registry (``diffusers.hooks._helpers``) and its argument lookup;
- the context-parallel hook internals (``diffusers.hooks.context_parallel``): which submodules it hooks, by
  which names.

``tests/core/test_diffusers_compat.py`` checks each of them against the installed diffusers, and that no other
module of fastdiff names them. ``SUPPORTED`` is the range pyproject.toml declares; the test suite passed on
each version in ``CHECKED``.

Example::

    import torch
    from fastdiff.core.diffusers_compat import hook_names, hook_registry

    hook_registry(torch.nn.Linear(2, 2))  # None: no hook was ever registered
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook

SUPPORTED = ">=0.42.0,<0.43"  # pyproject.toml's range: 0.41.0 fails Flux.2's first-block and TeaCache tests
CHECKED = ("0.42.0", "0.42.1")
REGISTRY_ATTRIBUTE = "_diffusers_hook"  # where HookRegistry.check_if_exists_or_initialize keeps a registry


class StatefulHook(ModelHook):
    """A hook with per-call state: diffusers' ``reset_stateful_hooks`` (and fastdiff's call start) reset it."""

    _is_stateful = True


def is_stateful(hook: ModelHook) -> bool:
    return bool(getattr(hook, "_is_stateful", False))


def set_stateful(hook: ModelHook, stateful: bool) -> None:
    """Mark ``hook`` (a wrapper around another hook) stateful as the hook it wraps is."""
    hook._is_stateful = stateful


def hook_registry(module: torch.nn.Module) -> HookRegistry | None:
    """``module``'s hook registry, or None when no hook was ever registered on it."""
    return getattr(module, REGISTRY_ATTRIBUTE, None)


def has_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries at least one registered hook."""
    registry = hook_registry(module)
    return registry is not None and bool(registry.hooks)


def hook_names(registry: HookRegistry) -> list[str]:
    """The registry's hook names, innermost (first registered) first."""
    return list(registry._hook_order)


def is_hook_chain(forward: Any, module: torch.nn.Module) -> bool:
    """Whether ``forward`` is the head of a diffusers hook chain on ``module`` (the partial its registry makes)."""
    func = getattr(forward, "func", None)
    return "create_new_forward" in getattr(func, "__qualname__", "") and forward.args[:1] == (module,)


def registry_module(registry: HookRegistry) -> torch.nn.Module:
    """The module a registry belongs to."""
    return registry._module_ref


def drop_registry(module: torch.nn.Module) -> None:
    """Delete ``module``'s (empty) registry, leaving it as it was before any hook."""
    delattr(module, REGISTRY_ATTRIBUTE)


def block_metadata_registry() -> tuple[Any, Any]:
    """diffusers' (``TransformerBlockMetadata``, ``TransformerBlockRegistry``): where its cache hooks find the
    hidden states each transformer block class takes and returns."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

    return TransformerBlockMetadata, TransformerBlockRegistry


def block_argument(metadata: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """The argument ``name`` of a transformer block call, positional or keyword, by the block's metadata."""
    return metadata._get_parameter_from_args_kwargs(name, args, kwargs)


def context_parallel_hooked(denoiser: torch.nn.Module, plan: dict) -> dict[torch.nn.Module, str]:
    """The submodules diffusers' context parallelism hooks for ``plan`` (the denoiser's ``_cp_plan``), each with
    the name of the hook it registers there."""
    from diffusers.hooks import context_parallel as cp

    hooked = {}
    for key, entry in plan.items():
        template = (
            cp._CONTEXT_PARALLEL_INPUT_HOOK_TEMPLATE
            if isinstance(entry, dict)
            else cp._CONTEXT_PARALLEL_OUTPUT_HOOK_TEMPLATE
        )
        found = cp._get_submodule_by_name(denoiser, key)
        for module in found if isinstance(found, list) else [found]:
            hooked[module] = template.format(key)
    return hooked


__all__ = [
    "SUPPORTED",
    "CHECKED",
    "REGISTRY_ATTRIBUTE",
    "StatefulHook",
    "is_stateful",
    "set_stateful",
    "hook_registry",
    "has_hooks",
    "hook_names",
    "is_hook_chain",
    "registry_module",
    "drop_registry",
    "block_metadata_registry",
    "block_argument",
    "context_parallel_hooked",
]
