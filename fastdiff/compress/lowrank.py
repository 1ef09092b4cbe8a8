"""Low-rank factorization: SVD-split Linear and conv layers of the denoiser into two thinner layers.

``lowrank(energy=0.9, rank=None, targets=linear)`` replaces each chosen layer ``W`` (out x in) by
``B @ A`` with ``A = sqrt(S) V^T[:r]`` and ``B = U[:, :r] sqrt(S)`` from ``torch.linalg.svd``:

- ``Linear(in, out)`` -> ``Linear(in, r, bias=False)`` + ``Linear(r, out)``; a 1x1 conv the same as convs;
- a ``k x k`` conv -> ``k x k`` conv to ``r`` channels (same stride/padding) + ``1x1`` conv to ``out``
  (SVD of the weight reshaped to ``out x (in k k)``).

The rank of each layer is the smallest that keeps ``energy`` of the squared singular values, or ``rank``
when given (capped at the full rank). A layer is left alone unless the split has fewer MACs
(``r (in + out) < in out`` for Linear/1x1, ``r (in k k + out) < in out k k`` for k x k). The layers are
swapped on their parents (``setattr``); ``remove()`` puts the original modules back. The handle reports
``params_before/after``, ``macs_before/after`` (torch's ``FlopCounterMode`` on the captured denoiser call,
MACs = FLOPs / 2), ``ranks`` ({layer: rank}) and ``layers``.

``targets``: ``linear``, ``conv1x1``, ``conv3x3`` (any k x k conv with k > 1), ``linear+conv1x1`` or ``all``.
``ranks_file`` (a JSON ``{layer: rank}``, relative paths resolved against the denoiser's directory) factors
exactly those layers at those ranks: it re-creates a saved factorization (see ``fastdiff.compress.recover``).

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("lowrank(energy=0.9,targets=all)")
    info = handle.handles[0]
    print(info.layers, info.macs_after / info.macs_before)
    handle.remove()
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import psutil
import torch
from torch import nn

from fastdiff.compress.common import count_params_macs, refuse_hooked_blocks, sized_handle
from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.train.inputs import capture_inputs

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

TARGETS = {
    "linear": ("linear",),
    "conv1x1": ("conv1x1",),
    "conv3x3": ("conv3x3",),
    "linear+conv1x1": ("linear", "conv1x1"),
    "all": ("linear", "conv1x1", "conv3x3"),
}


def layer_kind(m: nn.Module) -> str | None:
    """ "linear", "conv1x1", "conv3x3" (any k x k, k > 1) or None for layers this module cannot split."""
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, nn.Conv2d) and m.groups == 1 and isinstance(m.padding, (tuple, int)):
        return "conv1x1" if m.kernel_size == (1, 1) else "conv3x3"
    return None


def split_macs(m: nn.Module, r: int) -> tuple[int, int]:
    """(MACs per output position of the layer, of its rank-r split)."""
    out_ch = m.out_features if isinstance(m, nn.Linear) else m.out_channels
    fan_in = m.weight[0].numel()  # in (Linear) or in * k * k (conv)
    return fan_in * out_ch, r * (fan_in + out_ch)


def choose_rank(s: torch.Tensor, energy: float, rank: int | None) -> int:
    if rank is not None:
        return min(rank, len(s))
    kept = torch.cumsum(s.double() ** 2, 0) / (s.double() ** 2).sum()
    return int(torch.searchsorted(kept, torch.tensor(energy, dtype=kept.dtype, device=kept.device)).item()) + 1


class LowRankSplit(nn.Sequential):
    """The two layers (thin, then widening) that replace one layer split by ``lowrank``.

    ``weight``, ``bias`` and the sizes (``in_features`` ... ``out_channels``) are those of the rank-r layer it
    stands for (computed), for model code that reads its layers' weights (Z-Image's timestep embedder takes its
    dtype from ``mlp[0].weight``).
    """

    @property
    def weight(self) -> torch.Tensor:
        first, second = self[0].weight, self[1].weight
        dense = second.reshape(second.shape[0], -1) @ first.reshape(first.shape[0], -1)
        return dense.reshape(second.shape[0], *first.shape[1:])

    @property
    def bias(self) -> torch.Tensor | None:
        return self[1].bias

    # The sizes of the layer it stands for (SDXL's pipeline reads ``add_embedding.linear_1.in_features``).
    @property
    def in_features(self) -> int:
        return self[0].in_features

    @property
    def out_features(self) -> int:
        return self[1].out_features

    @property
    def in_channels(self) -> int:
        return self[0].in_channels

    @property
    def out_channels(self) -> int:
        return self[1].out_channels


def thin_svd(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.linalg.svd(w, full_matrices=False)``, taken of the transpose when ``w`` is wide: LAPACK's CPU SVD of
    a wide matrix runs several times slower than of its transpose (1536 x 8960: 5.7 s against 1.6 s here)."""
    if w.shape[0] >= w.shape[1]:
        return torch.linalg.svd(w, full_matrices=False)
    u, s, vh = torch.linalg.svd(w.T, full_matrices=False)
    return vh.T, s, u.T


def singular_values(w: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals(w)``, of the transpose when ``w`` is wide (as ``thin_svd``)."""
    return torch.linalg.svdvals(w if w.shape[0] >= w.shape[1] else w.T)


def factorize(m: nn.Module, r: int, svd=None) -> LowRankSplit:
    """Two layers whose composition is the rank-r SVD truncation of ``m``."""
    u, s, vh = svd if svd is not None else thin_svd(m.weight.detach().float().reshape(m.weight.shape[0], -1))
    root = s[:r].sqrt()
    a, b = root[:, None] * vh[:r], u[:, :r] * root[None, :]
    dtype = m.weight.dtype
    if isinstance(m, nn.Linear):
        first = nn.Linear(m.in_features, r, bias=False)
        second = nn.Linear(r, m.out_features, bias=m.bias is not None)
    else:
        first = nn.Conv2d(
            m.in_channels, r, m.kernel_size, m.stride, m.padding, m.dilation, bias=False, padding_mode=m.padding_mode
        )
        second = nn.Conv2d(r, m.out_channels, 1, bias=m.bias is not None)
    with torch.no_grad():
        first.weight.copy_(a.reshape(first.weight.shape))
        second.weight.copy_(b.reshape(second.weight.shape))
        if m.bias is not None:
            second.bias.copy_(m.bias)
    return LowRankSplit(first, second).to(device=m.weight.device, dtype=dtype).train(m.training)


@register
@dataclass(frozen=True)
class LowRank(Accelerator):
    """SVD-factorize Linear/conv layers into two thinner ones. Example: ``fp.accelerate("lowrank(energy=0.9)")``."""

    energy: float = option(0.9, gt=0, le=1)
    rank: int | None = option(None, ge=1)
    targets: Literal["linear", "conv1x1", "conv3x3", "linear+conv1x1", "all"] = "linear"
    ranks_file: str | None = None

    spec_name = "lowrank"
    kind = "compress"
    touches = frozenset({"denoiser.weights", "denoiser.structure"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.structure"})

    def apply(self, fp: FastPipeline) -> Handle:
        den = fp.denoiser
        denoiser_facts(den, "lowrank")
        refuse_hooked_blocks(den, "lowrank")
        inputs = capture_inputs(fp, batch=2)
        before = count_params_macs(den, inputs)
        plan = self._plan(den)
        swapped, ranks = [], {}
        for name, (m, r, split) in plan.items():
            parent_name, _, child = name.rpartition(".")
            parent = den.get_submodule(parent_name)
            setattr(parent, child, split)
            swapped.append((parent, child, m))
            ranks[name] = r

        def restore():
            for parent, child, original in reversed(swapped):
                setattr(parent, child, original)

        return sized_handle(restore, den, inputs, before, ranks=ranks, layers=len(ranks))

    def _plan(self, den) -> dict:
        """{layer name: (module, rank, its LowRankSplit)} of the layers to split; the model is not changed yet.

        The rank comes from the singular values alone (``svdvals``, several times cheaper than the full SVD);
        the full SVD runs only for the layers whose split pays."""
        modules = dict(den.named_modules())
        if self.ranks_file:
            path = Path(self.ranks_file)
            if not path.is_absolute() and not path.exists():
                path = Path(getattr(den.config, "_name_or_path", "") or ".") / path
            if not path.is_file():
                raise AcceleratorError(f"lowrank: ranks_file {self.ranks_file!r} not found (looked at {path})")
            wanted = json.loads(path.read_text())
            missing = [n for n in wanted if layer_kind(modules.get(n)) is None]
            if missing:
                raise AcceleratorError(f"lowrank: ranks_file names layers this model lacks: {missing[:3]}")
            return {n: (modules[n], int(r), factorize(modules[n], int(r))) for n, r in wanted.items()}
        kinds = TARGETS[self.targets]
        plan, kept, budget = {}, 0, free_bytes()
        for name, m in modules.items():
            kind = layer_kind(m)
            if kind not in kinds or min(m.weight.shape[0], m.weight[0].numel()) < 2:
                continue
            w = m.weight.detach().float().reshape(m.weight.shape[0], -1)
            if self.rank is not None:
                r = min(self.rank, min(w.shape))
            else:
                r = choose_rank(singular_values(w), self.energy, None)
            full, split = split_macs(m, r)
            if split >= full:  # the split would cost at least as much: leave the layer alone
                continue
            plan[name] = (m, r, factorize(m, r, thin_svd(w)))
            kept += sum(t.nbytes for t in plan[name][2].parameters())
            if m.weight.device.type == "cpu" and kept > budget:
                raise AcceleratorError(
                    f"lowrank: the new layers of the first {len(plan)} split ({self.targets}, energy "
                    f"{self.energy:g}) already need {kept / 2**30:.1f} GiB beside the original weights (kept "
                    f"for remove()), and {budget / 2**30:.1f} GiB is free; pass a lower energy, a rank, "
                    "narrower targets, or factorize on a machine with more memory"
                )
        return plan


def free_bytes() -> int:
    """Memory the planned layers may take: what the system has available, less 1 GiB for the SVDs themselves."""
    return psutil.virtual_memory().available - 2**30


def factored_ranks(den) -> dict[str, int]:
    """{layer name: rank} of the layers currently split by lowrank (for saving a factorization)."""
    out = {}
    for name, m in den.named_modules():
        if isinstance(m, LowRankSplit):
            first = m[0]
            out[name] = first.out_features if isinstance(first, nn.Linear) else first.out_channels
    return out


def merge_factors(den) -> int:
    """Replace every two-layer split in ``den`` by one dense layer with the product weight; returns the count."""
    merged = 0
    for name, rank in factored_ranks(den).items():
        seq = den.get_submodule(name)
        first, second = seq[0], seq[1]
        a = first.weight.detach().reshape(rank, -1)
        b = second.weight.detach().reshape(second.weight.shape[0], rank)
        if isinstance(first, nn.Linear):
            dense = nn.Linear(first.in_features, second.out_features, bias=second.bias is not None)
        else:
            dense = nn.Conv2d(
                first.in_channels,
                second.out_channels,
                first.kernel_size,
                first.stride,
                first.padding,
                first.dilation,
                bias=second.bias is not None,
                padding_mode=first.padding_mode,
            )
        with torch.no_grad():
            dense.weight.copy_((b @ a).reshape(dense.weight.shape))
            if second.bias is not None:
                dense.bias.copy_(second.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(den.get_submodule(parent_name), child, dense.to(first.weight.dtype))
        merged += 1
    return merged
