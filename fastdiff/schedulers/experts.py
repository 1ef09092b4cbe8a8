"""Timestep experts: different denoisers for different parts of the trajectory (trajectory stitching).

``experts(models=A|B, boundaries=0.5)`` runs denoiser A for the first half of the steps actually run (the high
noise levels) and B for the rest; ``boundaries`` are fractions of the trajectory (``fp.context.progress``),
one fewer than the models, strictly increasing. A model is ``self`` (the pipeline's own denoiser) or a
directory: a diffusers pipeline (its UNet/transformer is used; a ``fastdiff compress`` output keeps its pruned
or factorized structure) or a bare model directory. The scheduler, its state and every other component stay
the pipeline's own; only the denoiser call is routed. Experts must take the same inputs as the pipeline's
denoiser (class, latent channels, sample size, conditioning width): a mismatch is refused at apply time.

The typical use puts a cheaper model (pruned, distilled) on the high-noise steps, where only coarse
structure forms, and the full model on the low-noise ones. ``remove()`` drops the loaded experts and
restores the single model.

Example::

    fp = FastPipeline.from_pretrained(".fastdiff-cache/digits")
    fp.accelerate("experts(models=out/pruned|self,boundaries=0.5)")
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import HandleGroup, install_hook
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

    pass

# Config entries that must agree for an expert to take the pipeline denoiser's inputs.
MATCHING = (
    "in_channels",
    "out_channels",
    "sample_size",
    "patch_size",
    "cross_attention_dim",
    "num_class_embeds",
)


class _Route(ModelHook):
    """Sends each denoiser call to the expert of the current part of the trajectory."""

    def __init__(self, context, bounds: list[float], experts: list[torch.nn.Module | None]):
        super().__init__()
        self.context, self.bounds, self.experts = context, bounds, experts

    def new_forward(self, module, *args, **kwargs):
        expert = self.experts[bisect.bisect_right(self.bounds, self.context.progress)]
        if expert is None:  # "self": the pipeline's own denoiser, with its own hooks inside
            return self.fn_ref.original_forward(*args, **kwargs)
        self.context.nfe += 1
        self.context.total_nfe += 1
        return expert(*args, **kwargs)


def load_expert(path: str, like: torch.nn.Module) -> torch.nn.Module:
    """The denoiser stored at ``path`` (pipeline, ``fastdiff compress`` output or model directory), eval mode."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise AcceleratorError(f"experts: model directory {path!r} does not exist")
    if (directory / "model_index.json").is_file():
        from fastdiff.compress.recover import load_compressed

        # A compress output may carry accelerators (lowrank factors) on its wrapper: keep the wrapper alive.
        holder = load_compressed(directory)
        denoiser = holder.denoiser
        denoiser._fastdiff_holder = holder
    elif (directory / "config.json").is_file():
        denoiser = type(like).from_pretrained(directory)
        for tensor in [*denoiser.parameters(), *denoiser.buffers()]:
            tensor.data = tensor.data.clone()  # own the memory: mmapped weights round differently
    else:
        raise AcceleratorError(
            f"experts: {path!r} holds neither a pipeline (model_index.json) nor a model (config.json)"
        )
    return denoiser.to(next(like.parameters()).device).eval().requires_grad_(False)


def check_compatible(expert: torch.nn.Module, like: torch.nn.Module, path: str) -> None:
    if type(expert).__name__ != type(like).__name__:
        raise AcceleratorError(
            f"experts: {path!r} holds a {type(expert).__name__}; the pipeline's denoiser is a {type(like).__name__}"
        )
    for key in MATCHING:
        mine, theirs = like.config.get(key), expert.config.get(key)
        if mine != theirs:
            raise AcceleratorError(
                f"experts: {path!r} has {key}={theirs}, the pipeline's denoiser {key}={mine}; experts must take "
                "the same latents and conditioning"
            )


@register
@dataclass(frozen=True)
class Experts(Accelerator):
    """Route the denoiser call to a different model per part of the trajectory.

    Example: ``experts(models=/path/pruned|self,boundaries=0.5)``: the pruned model for the first half of the
    steps, the pipeline's own denoiser for the second.
    """

    models: str = "self|self"
    boundaries: str = "0.5"

    spec_name = "experts"
    kind = "compress"  # applied first: innermost on the denoiser, so guidance/forecast hooks wrap the routing
    touches = frozenset({"denoiser.forward", "denoiser.experts"})
    exclusive = frozenset({"denoiser.experts"})
    # deepcache, blockcache and tome hook inside one model only; experts route around it
    conflicts_with = frozenset({"deepcache", "blockcache", "tome"})

    @property
    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split("|")]

    @property
    def bound_list(self) -> list[float]:
        try:
            return [float(b) for b in self.boundaries.split("|") if b.strip()]
        except ValueError:
            raise AcceleratorError(
                f"experts: boundaries must be numbers in (0, 1) separated by '|', got {self.boundaries!r}"
            ) from None

    def validate(self) -> None:
        models, bounds = self.model_list, self.bound_list
        if len(models) < 2 or any(not m for m in models):
            raise AcceleratorError(f"experts: models needs at least two entries separated by '|', got {self.models!r}")
        if len(bounds) != len(models) - 1:
            raise AcceleratorError(
                f"experts: {len(models)} models need {len(models) - 1} boundaries, got {self.boundaries!r}"
            )
        if any(not 0 < b < 1 for b in bounds) or bounds != sorted(set(bounds)):
            raise AcceleratorError(
                f"experts: boundaries must increase strictly inside (0, 1), got {self.boundaries!r}"
            )

    def apply(self, fp: FastPipeline) -> HandleGroup:
        own = fp.denoiser
        loaded: dict[str, torch.nn.Module] = {}
        for path in self.model_list:
            if path != "self" and path not in loaded:
                loaded[path] = load_expert(path, own)
                check_compatible(loaded[path], own, path)
        experts = [None if path == "self" else loaded[path] for path in self.model_list]
        handle = install_hook(own, _Route(fp.context, self.bound_list, experts), "fastdiff.experts", fp.context)
        group = HandleGroup([handle], on_remove=loaded.clear)
        group.info.update(experts=experts)
        return group
