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


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """Batch size of a denoiser call: the first dimension of the sample (first argument or ``sample=``)."""
    sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states", kwargs.get("x")))
    if isinstance(sample, list) and sample and all(isinstance(s, torch.Tensor) for s in sample):
        return len(sample)  # Z-Image takes its batch as a list of per-image latents
    return sample.shape[0] if isinstance(sample, torch.Tensor) and sample.dim() else None
