"""``sparsity(pattern=2:4|unstructured, amount=0.5)``: zeroed weights in a denoiser's Linear and conv layers.

2:4 (the 2 largest-magnitude of every 4 consecutive input weights kept) is the pattern sparse tensor cores
accelerate; ``unstructured`` zeroes the ``amount`` of smallest-magnitude weights of each layer. On CPU the
weights stay dense, so the model runs no faster; only its compressed files shrink.

The weights are zeroed in place. Apply keeps the values it zeroed (half the weights at 2:4) and a
bit-per-weight mask, and ``remove()`` writes the values back: the originals return bit for bit.
(torch.nn.utils.prune keeps the original and the masked product of every weight: SDXL's fp32 UNet would need
10.3 GB more than this.) Training the sparse model (``fastdiff compress``' recovery) keeps the zeros: once the
denoiser runs with gradients on, each weight's gradient is masked. ``make_permanent`` drops what ``remove()``
would need, for saving.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("sparsity(pattern=2:4)")
    print(handle.handles[0].sparsity)   # 0.5
    handle.remove()                     # the original weights, bit for bit
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from diffusers.hooks import ModelHook
from torch import nn

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle, install_hook
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK = "fastdiff.sparsity"


@dataclass
class _Zeroed:
    """One layer's kept-weight mask (a bit per weight, on the CPU) and the values its zeros replaced."""

    bits: np.ndarray
    shape: torch.Size
    removed: torch.Tensor  # in mask order
    grad_hook: object = None  # the weight's gradient hook, once training has started
    grad_keep: torch.Tensor | None = None  # the mask on the weight's device, while training

    @classmethod
    def of(cls, weight: torch.Tensor, keep: torch.Tensor) -> _Zeroed:
        bits = np.packbits(keep.reshape(-1).cpu().numpy())  # 1/8 of a bool mask: SDXL's UNet in 0.33 GB
        return cls(bits, keep.shape, weight[~keep])  # boolean indexing copies the values

    def keep(self, device) -> torch.Tensor:
        flat = np.unpackbits(self.bits, count=math.prod(self.shape))
        return torch.from_numpy(flat).view(self.shape).to(device=device, dtype=torch.bool)

    def mask_grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.masked_fill(~self.grad_keep, 0)


@dataclass
class _Sparse:
    layers: dict[nn.Module, _Zeroed]
    hook: Handle


_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # denoiser -> _Sparse


class _KeepZeros(ModelHook):
    """Registers the gradient masks the first time the denoiser runs with gradients on (once per weight)."""

    def __init__(self, layers: dict[nn.Module, _Zeroed]):
        super().__init__()
        self.layers = layers

    def pre_forward(self, module, *args, **kwargs):
        if torch.is_grad_enabled():
            for m, zeroed in self.layers.items():
                if zeroed.grad_hook is None and m.weight.requires_grad:
                    zeroed.grad_keep = zeroed.keep(m.weight.device)
                    zeroed.grad_hook = m.weight.register_hook(zeroed.mask_grad)
        return args, kwargs


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """Bool mask keeping the 2 largest-magnitude weights of every 4 consecutive inputs of each output."""
    flat = weight.reshape(weight.shape[0], -1, 4).abs()
    keep = torch.zeros(flat.shape, dtype=torch.bool, device=weight.device).scatter_(
        -1, flat.topk(2, dim=-1).indices, True
    )
    return keep.reshape(weight.shape)


def magnitude_mask(weight: torch.Tensor, amount: float) -> torch.Tensor:
    """Bool mask keeping all but the ``round(amount * numel)`` smallest-magnitude weights (torch's L1 rule)."""
    keep = torch.ones(weight.shape, dtype=torch.bool, device=weight.device)
    drop = round(amount * weight.numel())
    if drop:
        keep.view(-1)[weight.detach().abs().view(-1).topk(drop, largest=False).indices] = False
    return keep


@register
@dataclass(frozen=True)
class Sparsity(Accelerator):
    """Zeroed weights on Linear/conv layers (no CPU speedup). Example: ``fp.accelerate("sparsity(pattern=2:4)")``."""

    pattern: Literal["2:4", "unstructured"] = "2:4"
    amount: float = option(0.5, gt=0, lt=1)

    spec_name = "sparsity"
    kind = "compress"
    touches = frozenset({"denoiser.weights"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.weights"})

    def validate(self) -> None:
        if self.pattern == "2:4" and self.amount != 0.5:
            raise AcceleratorError(f"sparsity: pattern 2:4 zeroes exactly half; amount must be 0.5, got {self.amount}")

    def apply(self, fp: FastPipeline) -> Handle:
        den = fp.denoiser
        denoiser_facts(den, "sparsity")
        layers = [m for m in den.modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and m.weight.shape[1] > 1]
        if self.pattern == "2:4":  # groups of 4 along the (flattened) input dimension
            layers = [m for m in layers if m.weight[0].numel() % 4 == 0]
        zeroed: dict[nn.Module, _Zeroed] = {}
        with torch.no_grad():
            for m in layers:
                w = m.weight
                keep = two_four_mask(w) if self.pattern == "2:4" else magnitude_mask(w, self.amount)
                zeroed[m] = _Zeroed.of(w, keep)
                w.masked_fill_(~keep, 0)
        state = _Sparse(zeroed, install_hook(den, _KeepZeros(zeroed), HOOK))
        _STATES[den] = state
        zeros = sum(int((m.weight == 0).sum()) for m in layers)
        total = sum(m.weight.numel() for m in layers)
        return Handle(lambda: _restore(den, state), layers=len(layers), sparsity=zeros / max(total, 1))


def _forget(den, state: _Sparse) -> None:
    if _STATES.get(den) is state:
        del _STATES[den]
    state.hook.remove()
    for z in state.layers.values():
        if z.grad_hook is not None:
            z.grad_hook.remove()


def _restore(den, state: _Sparse) -> None:
    if _STATES.get(den) is not state:  # made permanent, or removed already
        return
    _forget(den, state)
    with torch.no_grad():  # reversed: a weight shared by two layers ends as it began
        for m, z in reversed(state.layers.items()):
            m.weight.masked_scatter_(~z.keep(m.weight.device), z.removed)
    state.layers.clear()  # the handle may live on: hold nothing


def make_permanent(den) -> int:
    """Keep the zeros for good (for saving): drop the stored values and hooks; returns how many layers it held."""
    state = _STATES.get(den)
    if state is None:
        return 0
    _forget(den, state)
    count = len(state.layers)
    state.layers.clear()
    return count


__all__ = ["Sparsity", "make_permanent", "two_four_mask", "magnitude_mask"]
