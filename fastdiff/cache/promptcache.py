"""Prompt cache: reuse text-encoder outputs across pipeline calls (an LRU per text encoder).

Every text encoder the pipeline has (``TEXT_ENCODER_ATTRS`` in ``fastdiff/core/models.py``: SD's
``text_encoder``, SDXL's ``text_encoder`` and ``text_encoder_2``) gets a hook whose ``new_forward`` looks the
call up by everything that changes the embedding: the contents of every tensor argument (``input_ids``,
``attention_mask``, ...), every other argument (``output_hidden_states``, ``return_dict``, ...) and a
fingerprint of the encoder's weights (replacing a weight, ``load_state_dict`` or an in-place ``copy_`` makes
old entries unreachable) and peft's adapter state (LoRA scales from ``cross_attention_kwargs={"scale": s}``,
``set_adapters`` weights, active, fused and disabled adapters). A hit returns a clone of the stored output, so
callers cannot change the cache; negative prompts are cached like any other text. Hooks inside the encoder
(torch forward hooks, other tools' hooks or ``forward``) are part of the key by identity. Calls with autograd
enabled or an encoder in training mode bypass the cache (counted as misses). ``clip_skip`` asks the encoder
for its hidden states, a different argument, so it has entries of its own.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("promptcache(size=8)")
    fp(prompt="a red fox", num_inference_steps=2)
    fp(prompt="a red fox", num_inference_steps=2)  # text encoder not run: prompt and "" are hits
    print(handle.handles[0].stats())  # {'hits': 2, 'misses': 2, 'entries': 2, 'encoders': {...}}
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.diffusers_compat import hook_registry
from fastdiff.core.hooks import Handle, HandleGroup, install_hooks
from fastdiff.core.models import TEXT_ENCODER_ATTRS, UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK_NAME = "fastdiff.promptcache"


class _Uncacheable(Exception):
    """An argument the cache cannot key (the call runs uncached)."""


def _key_of(value: Any) -> Any:
    """A hashable key for a forward argument; tensors are keyed by their contents."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return ("tensor", str(value.dtype), tuple(value.shape), str(value.device), data.numpy().tobytes())
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key_of(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _key_of(v)) for k, v in value.items())))
    raise _Uncacheable(type(value).__name__)


def _clone(value: Any) -> Any:
    """Deep copy of an encoder output: tensors cloned, containers and model outputs rebuilt."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):  # transformers' ModelOutput is an OrderedDict of its non-None fields
        items = {k: _clone(v) for k, v in value.items()}
        return type(value)(**items) if dataclasses.is_dataclass(value) else type(value)(items)
    return value


def _weights_fingerprint(module: torch.nn.Module) -> tuple:
    # data_ptr changes when a tensor is replaced or moved; _version when it is modified in place.
    return tuple((t.data_ptr(), t._version, str(t.dtype)) for t in (*module.parameters(), *module.buffers()))


def _module_state(module: torch.nn.Module) -> tuple:
    """What changes the output besides weights and arguments: peft adapter state and hooks inside the encoder.

    peft: scales, active, merged and disabled adapters of every tuner layer. Hooks: the identity of every torch
    forward (pre-)hook, other tool's diffusers hook and replaced ``forward`` on a submodule (and torch's global
    hooks), so adding or removing one makes old entries unreachable. A hook whose effect changes while it stays
    installed cannot be seen; remove promptcache around such a hook.
    """
    from torch.nn.modules import module as torch_module

    state: list = [tuple(map(id, torch_module._global_forward_hooks.values()))]
    state.append(tuple(map(id, torch_module._global_forward_pre_hooks.values())))
    for name, m in module.named_modules():
        scaling = getattr(m, "scaling", None)
        if isinstance(scaling, dict):  # a peft tuner layer (LoRA and friends)
            active = tuple(getattr(m, "active_adapters", ()))
            merged = tuple(getattr(m, "merged_adapters", ()))
            state.append((name, tuple(sorted(scaling.items())), active, merged, bool(m.disable_adapters)))
        if m is module:  # hooks on the encoder itself run on hits too (outside the cached forward)
            continue
        hooks = tuple(map(id, m._forward_pre_hooks.values())) + tuple(map(id, m._forward_hooks.values()))
        registry = hook_registry(m)
        if registry is not None:
            hooks += tuple(id(h) for n, h in registry.hooks.items() if not n.startswith(HOOK_NAME))
        elif "forward" in m.__dict__:
            hooks += (id(m.__dict__["forward"]),)
        if hooks:
            state.append((name, hooks))
    return tuple(state)


class _LRU:
    """Stored outputs of one encoder, least recently used first."""

    def __init__(self, size: int):
        self.size, self.entries = size, OrderedDict()
        self.hits = self.misses = 0

    def get(self, key):
        if key in self.entries:
            self.entries.move_to_end(key)
            self.hits += 1
            return self.entries[key]
        self.misses += 1
        return None

    def put(self, key, value) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


class PromptCacheHook(ModelHook):
    """``new_forward`` on a text encoder: answer from the LRU, or run the encoder and store a clone."""

    def __init__(self, lru: _LRU):
        super().__init__()
        self.lru = lru

    def new_forward(self, module, *args, **kwargs):
        if torch.is_grad_enabled() or module.training:
            self.lru.misses += 1
            return self.fn_ref.original_forward(*args, **kwargs)
        try:
            key = (_weights_fingerprint(module), _module_state(module), _key_of(args), _key_of(kwargs))
        except _Uncacheable:
            self.lru.misses += 1
            return self.fn_ref.original_forward(*args, **kwargs)
        stored = self.lru.get(key)
        if stored is not None:
            return _clone(stored)
        output = self.fn_ref.original_forward(*args, **kwargs)
        self.lru.put(key, _clone(output))
        return output


@register
@dataclasses.dataclass(frozen=True)
class PromptCache(Accelerator):
    """Cache text-encoder outputs across calls: at most ``size`` distinct inputs per text encoder.

    The handle returned by ``apply`` has ``stats()`` -> ``{"hits", "misses", "entries", "encoders"}``
    (totals, and the same per encoder attribute). Example: ``fp.accelerate("promptcache(size=32)")``.
    """

    size: int = option(32, ge=1)

    spec_name = "promptcache"
    kind = "text"
    touches = frozenset({"text_encoder.forward"})
    runs_on_xla = True
    conflicts_with = frozenset({"promptcache"})  # two caches on one encoder would share a hook name

    def apply(self, fp: FastPipeline) -> Handle:
        encoders = {
            attr: module
            for attr in TEXT_ENCODER_ATTRS
            if isinstance(module := getattr(fp.pipe, attr, None), torch.nn.Module)
        }
        if not encoders:
            raise UnsupportedModelError(
                f"promptcache needs a text encoder; {type(fp.pipe).__name__} has none of "
                f"{', '.join(TEXT_ENCODER_ATTRS)} (prompt pipelines such as StableDiffusion(XL)Pipeline have)"
            )
        lrus = {attr: _LRU(self.size) for attr in encoders}
        hooks = [(module, PromptCacheHook(lrus[attr])) for attr, module in encoders.items()]
        handles = install_hooks(hooks, HOOK_NAME, fp.context).handles

        def stats() -> dict:
            per = {a: {"hits": c.hits, "misses": c.misses, "entries": len(c.entries)} for a, c in lrus.items()}
            total = {k: sum(p[k] for p in per.values()) for k in ("hits", "misses", "entries")}
            return {**total, "encoders": per}

        def clear() -> None:
            for c in lrus.values():
                c.entries.clear()

        group = HandleGroup(handles, on_remove=clear)
        group.info.update(stats=stats, clear=clear)
        return group
