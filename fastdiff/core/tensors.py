"""Helpers for the nested tensor structures that denoisers take and return."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, lists, dicts and diffusers/transformers outputs."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):  # includes BaseOutput / ModelOutput (OrderedDicts of their set fields)
        items = {k: map_tensors(v, fn) for k, v in value.items()}
        return type(value)(**items) if dataclasses.is_dataclass(value) else type(value)(items)
    return value


# map_tensors, not torch.utils._pytree: pytree keeps containers it has no registration for (a library's own output
# dataclass) as leaves, with their tensors unseen.
def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a nested value, in ``map_tensors`` order."""
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(value, keep)
    return found


def with_tensors(template: Any, tensors: list[torch.Tensor]) -> Any:
    """``template`` with its tensors replaced, in order, by ``tensors`` (the inverse of ``tensors_of``)."""
    it = iter(tensors)
    return map_tensors(template, lambda _: next(it))


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """Batch size of a denoiser call: the first dimension of the sample (first argument or ``sample=``)."""
    sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states", kwargs.get("x")))
    if isinstance(sample, list) and sample and all(isinstance(s, torch.Tensor) for s in sample):
        return len(sample)  # Z-Image takes its batch as a list of per-image latents
    return sample.shape[0] if isinstance(sample, torch.Tensor) and sample.dim() else None


def _per_image_list(value, batch: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == batch
        and all(isinstance(v, torch.Tensor) for v in value)
        and len({tuple(v.shape) for v in value}) == 1
    )


def stack_image_lists(value: Any, batch: int) -> Any:
    """``value`` with every list of ``batch`` same-shaped tensors (Z-Image's per-image outputs) stacked batch-first."""
    if _per_image_list(value, batch):
        return torch.stack(value)
    if isinstance(value, (tuple, list)):
        return type(value)(stack_image_lists(v, batch) for v in value)
    if isinstance(value, dict):
        items = {k: stack_image_lists(v, batch) for k, v in value.items()}
        return type(value)(**items) if dataclasses.is_dataclass(value) else type(value)(items)
    return value


def unstack_like(value: Any, template: Any, batch: int) -> Any:
    """Undo ``stack_image_lists``: where ``template`` held a per-image list, ``value``'s tensor becomes one again."""
    if _per_image_list(template, batch):
        return list(value.unbind(0))
    if isinstance(template, (tuple, list)):
        return type(template)(unstack_like(v, t, batch) for v, t in zip(value, template))
    if isinstance(template, dict):
        items = {k: unstack_like(value[k], t, batch) for k, t in template.items()}
        return type(template)(**items) if dataclasses.is_dataclass(template) else type(template)(items)
    return value


def pixels(output) -> Any:
    """What a pipeline call produced: ``output.images`` (image pipelines) or ``output.frames`` (video pipelines:
    batch x frames x height x width x channels with ``output_type="np"``); None for other outputs."""
    images = getattr(output, "images", None)
    return images if images is not None else getattr(output, "frames", None)
