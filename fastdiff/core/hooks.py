"""The one way fastdiff intercepts modules: named, removable hooks on diffusers' ``HookRegistry``.

``install_hook`` registers a ``ModelHook`` under a name and returns a Handle that removes it. Hooks whose class
sets ``outermost = True`` (the step-context publisher) are kept outside every other hook on the module, so the
context they publish is current before any accelerator's ``pre_forward`` runs.

Given a ``StepContext``, a hook is *gated*: it acts only while that context's FastPipeline is inside a call
(``fp(...)``); any other call of the module (the diffusers pipeline called directly, a sibling pipeline sharing
the module) runs it exactly as if it were unhooked. Its name is made unique to the context, so pipelines that
share a module each keep their own hooks.

When the last hook of a module is removed, the module is left as it was before the first one: no hook registry
and no instance ``forward`` (unless it had them before).

Example::

    import torch
    from diffusers.hooks import ModelHook
    from fastdiff.core.hooks import install_hook

    class Double(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    lin = torch.nn.Linear(2, 2)
    handle = install_hook(lin, Double(), "double")
    handle.remove()  # lin behaves exactly as before, and its __dict__ is as before
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook

from fastdiff.core.diffusers_compat import (
    drop_registry,
    hook_names,
    hook_registry,
    is_hook_chain,
    is_stateful,
    registry_module,
    set_stateful,
)


class DirectCallError(RuntimeError):
    """An accelerator refuses a call of the wrapped diffusers pipeline that bypasses the FastPipeline."""


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


class GatedHook(ModelHook):
    """Runs ``hook`` only while ``context.active``; otherwise calls the wrapped forward untouched.

    A hook with only ``pre_forward``/``post_forward`` is gated in those (one frame fewer per call than a gated
    ``new_forward``: host time on every step); ``gated`` picks ``GatedForwardHook`` for a hook with a
    ``new_forward``."""

    hook: ModelHook
    context: Any

    def __init__(self, hook: ModelHook, context):
        self.__dict__.update(hook=hook, context=context, _fn_ref=None)
        super().__init__()
        set_stateful(self, is_stateful(hook))  # diffusers resets stateful hooks through this flag
        # ModelHook's own pre/post_forward pass everything through: skip the call (host time on every step)
        own = type(hook)
        self._pre = None if own.pre_forward is ModelHook.pre_forward else hook.pre_forward
        self._post = None if own.post_forward is ModelHook.post_forward else hook.post_forward

    @property
    def fn_ref(self):
        return self._fn_ref

    @fn_ref.setter
    def fn_ref(self, value) -> None:  # the wrapped hook calls self.fn_ref.original_forward itself
        self._fn_ref = value
        self.hook.fn_ref = value

    @property
    def outermost(self) -> bool:
        return getattr(self.hook, "outermost", False)

    def initialize_hook(self, module):
        return self.hook.initialize_hook(module)

    def deinitalize_hook(self, module):
        return self.hook.deinitalize_hook(module)

    def reset_state(self, module):
        return self.hook.reset_state(module)

    def pre_forward(self, module, *args, **kwargs):
        if self._pre is None or not self.context.active:
            return args, kwargs
        return self._pre(module, *args, **kwargs)

    def post_forward(self, module, output):
        if self._post is None or not self.context.active:
            return output
        return self._post(module, output)


class GatedForwardHook(GatedHook):
    """``GatedHook`` for a hook with a ``new_forward``: pre-forward, new forward and post-forward run in its own
    ``new_forward``, so the inactive path is one call of the wrapped forward."""

    def __init__(self, hook: ModelHook, context):
        super().__init__(hook, context)
        self._new = hook.new_forward  # type: ignore[attr-defined]  # gated() picks this class for hooks that have one

    pre_forward = ModelHook.pre_forward  # type: ignore[assignment]  # new_forward calls the hook's own
    post_forward = ModelHook.post_forward  # type: ignore[assignment]

    def new_forward(self, module, *args, **kwargs):
        if not self.context.active:
            return self._fn_ref.original_forward(*args, **kwargs)
        if self._pre is not None:
            args, kwargs = self._pre(module, *args, **kwargs)
        output = self._new(module, *args, **kwargs)
        return output if self._post is None else self._post(module, output)


def gated(hook: ModelHook, context) -> GatedHook:
    """``hook`` gated by ``context`` (``GatedForwardHook`` where the hook has a ``new_forward``)."""
    return (GatedForwardHook if hasattr(hook, "new_forward") else GatedHook)(hook, context)


@contextmanager
def all_or_nothing(handles: list[Handle] | None = None) -> Iterator[list[Handle]]:
    """Collect the handles of one ``apply``; if the block raises, remove them (last first) and re-raise, so a
    failed ``apply`` leaves the pipeline as it found it.

    Example::

        with all_or_nothing() as handles:
            for layer in layers:
                handles.append(install_hook(layer, hook, "fastdiff.x", fp.context))
        return HandleGroup(handles)
    """
    handles = [] if handles is None else handles
    try:
        yield handles
    except BaseException:
        for handle in reversed(handles):
            handle.remove()
        raise


def install_hooks(pairs: Iterable[tuple[torch.nn.Module, ModelHook]], name: str, context=None) -> HandleGroup:
    """``install_hook`` for every (module, hook) of ``pairs`` as ``name``, all or nothing (``all_or_nothing``)."""
    with all_or_nothing() as handles:
        for module, hook in pairs:
            handles.append(install_hook(module, hook, name, context))
    return HandleGroup(handles)


def install_hook(module: torch.nn.Module, hook: ModelHook, name: str, context=None) -> Handle:
    """Register ``hook`` on ``module`` as ``name`` (gated by ``context`` if given); refuse a name already taken."""
    if context is not None:
        hook, name = gated(hook, context), f"{name}@{context.owner}"
    registry = tracked_registry(module)
    reattach(module)
    if registry.get_hook(name) is not None:
        raise RuntimeError(
            f"{name.split('@')[0]} is already installed on this {type(module).__name__} by the same "
            "FastPipeline; remove it first"
        )
    registry.register_hook(hook, name)
    _keep_outermost_last(registry)
    return Handle(lambda: _remove(module, name))


def strip_copied_hooks(root: torch.nn.Module) -> list[str]:
    """Remove, with a warning, gated hooks that came with a copy of a wrapped model (their context was copied,
    so they never act but sit in the chain and can stop other hooks acting); return ``"module: hook"`` for each."""
    stripped = []
    for path, module in root.named_modules():
        registry = hook_registry(module)
        for name in hook_names(registry) if registry is not None else []:
            hook = registry.hooks[name]  # type: ignore[union-attr]  # not None inside this loop
            if isinstance(hook, GatedHook) and hook.context.is_copy:
                _remove(module, name)
                stripped.append(f"{path or type(root).__name__}: {name}")
    if stripped:
        warnings.warn(
            f"{type(root).__name__} carried {len(stripped)} fastdiff hooks copied with it from a wrapped model "
            f"({', '.join(stripped[:3])}{', ...' if len(stripped) > 3 else ''}); removed them. Copy models before "
            "wrapping them (or after unwrap()) to keep them plain",
            stacklevel=3,
        )
    return stripped


def tracked_registry(module: torch.nn.Module) -> HookRegistry:
    """``module``'s hook registry, noting (when it has no hooks yet) what to undo when its last hook goes: the
    registry if we made it (diffusers' cache_context makes an empty one on Flux-style transformers), and the
    instance forward its hooks leave behind. For hooks that diffusers registers on our behalf (its context
    parallelism): call this first, take them off with ``remove_hook``."""
    fresh = hook_registry(module) is None
    had_forward = "forward" in module.__dict__
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if not registry.hooks and not hasattr(registry, "_fastdiff_created"):
        setattr(registry, "_fastdiff_created", (fresh, had_forward))  # noqa: B010  # not a HookRegistry field
    return registry


def remove_hook(module: torch.nn.Module, name: str) -> None:
    """Take hook ``name`` off ``module`` (keeping the hooks outside it working) and, with the last hook gone,
    leave the module as ``tracked_registry`` found it."""
    _remove(module, name)


def reset_call_state(module: torch.nn.Module) -> None:
    """A call starts: reset fastdiff's stateful hooks (``_is_stateful``) on ``module`` and its submodules through
    diffusers' hook lifecycle (``reset_state``). Other tools' hooks keep their state: diffusers' cache hooks hold
    the cache context their user set before the call (diffusers resets them itself at the call's end)."""
    for sub in module.modules():
        registry = hook_registry(sub)
        for hook in [] if registry is None else list(registry.hooks.values()):
            if isinstance(hook, GatedHook) and is_stateful(hook):
                hook.reset_state(sub)


def base_names(module: torch.nn.Module) -> list[str]:
    """Names of the hooks on ``module`` without their per-pipeline suffix."""
    registry = hook_registry(module)
    return [] if registry is None else [n.split("@")[0] for n in hook_names(registry)]


def has_hook(module: torch.nn.Module, name: str) -> bool:
    return name in base_names(module)


def _remove(module: torch.nn.Module, name: str, tidy: bool = True) -> None:
    registry = hook_registry(module)
    if registry is None or registry.get_hook(name) is None:
        return
    current = module.__dict__.get("forward")
    replaced = current is not None and not is_hook_chain(current, module)  # another tool wrapped us since
    # diffusers' remove_hook on a middle hook overwrites the next hook's new_forward; peel from the outside.
    order = hook_names(registry)
    outer = order[order.index(name) + 1 :]
    peeled = [(n, registry.hooks[n]) for n in outer]
    for n in reversed(outer):
        registry.remove_hook(n, recurse=False)
    registry.remove_hook(name, recurse=False)
    for n, hook in peeled:
        registry.register_hook(hook, n)
    if replaced and current is not None:  # leave the other tool's forward in place; it is its to restore
        module.forward = current
    if tidy and not registry.hooks and hasattr(registry, "_fastdiff_created"):
        created, had_forward = registry.__dict__.pop("_fastdiff_created")
        if created:
            drop_registry(module)
        if not had_forward and not replaced:
            module.__dict__.pop("forward", None)


def reattach(module: torch.nn.Module) -> bool:
    """Rebuild the hook chain on ``module``'s current forward if another tool swapped it out and back.

    A tool that wrapped ``forward`` over the chain and restored a plain forward on exit (the DeepCache package
    installed before fastdiff, then disabled) leaves the chain detached around a stale function; the hooks are
    re-registered on the forward the module has now. A forward still wrapped by another tool is left alone.
    """
    registry = hook_registry(module)
    current = module.__dict__.get("forward")
    if registry is None or not registry.hooks or current is None or is_hook_chain(current, module):
        return False
    if getattr(current, "__func__", None) is not type(module).forward:
        return False  # another tool's wrapper is in place
    hooks = [(n, registry.hooks[n]) for n in hook_names(registry)]
    for n, _ in reversed(hooks):
        registry.remove_hook(n, recurse=False)
    module.forward = current
    for n, hook in hooks:
        registry.register_hook(hook, n)
    return True


def _keep_outermost_last(registry: HookRegistry) -> None:
    order = hook_names(registry)
    outer = [n for n in order if getattr(registry.hooks[n], "outermost", False)]
    if outer and order[-len(outer) :] != outer:
        hooks = [registry.hooks[n] for n in outer]
        for n in outer:
            _remove(registry_module(registry), n, tidy=False)
        for n, hook in zip(outer, hooks):
            registry.register_hook(hook, n)
