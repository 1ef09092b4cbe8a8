"""The one way fastdiff intercepts modules: named, removable hooks on diffusers' ``HookRegistry``.

``install_hook`` registers a ``ModelHook`` under a name and returns a Handle that removes it. Hooks whose class
sets ``outermost = True`` (the step-context publisher) are kept outside every other hook on the module, so the
context they publish is current before any accelerator's ``pre_forward`` runs.

Example::

    import torch
    from diffusers.hooks import ModelHook
    from fastdiff.core.hooks import install_hook

    class Double(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    lin = torch.nn.Linear(2, 2)
    handle = install_hook(lin, Double(), "double")
    handle.remove()  # lin behaves exactly as before
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from diffusers.hooks import HookRegistry, ModelHook


class Handle:
    """Undoes one change. ``remove()`` is idempotent."""

    def __init__(self, undo: Callable[[], None], **info):
        self._undo = undo
        self.removed = False
        self.info = info

    def remove(self) -> None:
        if not self.removed:
            self.removed = True
            self._undo()

    def __getattr__(self, name):
        info = self.__dict__.get("info", {})
        if name in info:
            return info[name]
        raise AttributeError(name)


class HandleGroup(Handle):
    """Several handles removed together, last applied first."""

    def __init__(self, handles: Iterable[Handle], on_remove: Callable[[], None] | None = None):
        self.handles = list(handles)

        def undo():
            for h in reversed(self.handles):
                h.remove()
            if on_remove:
                on_remove()

        super().__init__(undo)


def install_hook(module: torch.nn.Module, hook: ModelHook, name: str) -> Handle:
    """Register ``hook`` on ``module`` as ``name``; refuse a name already taken."""
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if registry.get_hook(name) is not None:
        raise RuntimeError(f"a hook named {name!r} is already installed on {type(module).__name__}")
    registry.register_hook(hook, name)
    _keep_outermost_last(registry)
    return Handle(lambda: _remove(module, name))


def has_hook(module: torch.nn.Module, name: str) -> bool:
    registry = getattr(module, "_diffusers_hook", None)
    return registry is not None and registry.get_hook(name) is not None


def _remove(module: torch.nn.Module, name: str) -> None:
    registry = getattr(module, "_diffusers_hook", None)
    if registry is None or registry.get_hook(name) is None:
        return
    # diffusers' remove_hook on a middle hook overwrites the next hook's new_forward; peel from the outside.
    outer = registry._hook_order[registry._hook_order.index(name) + 1 :]
    peeled = [(n, registry.hooks[n]) for n in outer]
    for n in reversed(outer):
        registry.remove_hook(n, recurse=False)
    registry.remove_hook(name, recurse=False)
    for n, hook in peeled:
        registry.register_hook(hook, n)


def _keep_outermost_last(registry: HookRegistry) -> None:
    order = list(registry._hook_order)
    outer = [n for n in order if getattr(registry.hooks[n], "outermost", False)]
    if outer and order[-len(outer) :] != outer:
        hooks = [registry.hooks[n] for n in outer]
        for n in outer:
            _remove(registry._module_ref, n)
        for n, hook in zip(outer, hooks):
            registry.register_hook(hook, n)
