"""DeepCache for UNets: reuse the deep features of the last full pass and run only the shallow skip branch.

A UNet's up path consumes one skip feature per up-resnet. ``branch=B`` (0 = the shallowest skip, the
``conv_in`` output; the same numbering as the ``DeepCache`` package's ``cache_branch_id`` for SD/SDXL) keeps
the up-resnets that consume skips ``0..B`` and the down modules that produce them. On a full step the whole
UNet runs and the feature entering the up-resnet of skip ``B`` is stored, per guidance branch; on a cached step
every deeper module (down layers producing skips > B, the mid block, the deeper up blocks/layers) returns an
empty placeholder without running, and the module just before the kept up-resnets returns the stored feature.

``schedule=uniform`` runs a full pass every ``interval`` steps; ``nonuniform`` keeps the same number of full
passes but spaces them quadratically around a centre step (the package's ``sample_from_quad_center``), and
``warmup=K`` forces full passes for the first K steps. State is cleared at the start of every call.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("scheduler(name=dpm++2m,steps=6);deepcache(interval=3,branch=0)")
    images = fp(prompt="a red fox", output_type="np").images
    handle.remove()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from diffusers.hooks import ModelHook

from fastdiff.core.branch_state import BranchState
from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.diffusers_compat import StatefulHook
from fastdiff.core.hooks import Handle, install_hooks
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

# Non-uniform spacing as in the package's example (``pow=1.4, center=15`` for 50 steps): centre at 30%.
QUAD_POWER, QUAD_CENTER = 1.4, 0.3


def quad_center_steps(num_steps: int, count: int, center: int, power: float = QUAD_POWER) -> list[int] | None:
    """``count`` full steps spaced quadratically around ``center`` (the package's ``sample_from_quad_center``).

    The package raises a negative base to ``1/power`` in Python, which yields a complex number whose real part
    it keeps after ``**power``; complex arithmetic is spelled out here to give the same steps.
    Returns None where no power in (1, ``power``] gives ``count`` distinct steps.
    """
    while power > 1:
        start, stop = complex(-center) ** (1 / power), complex(num_steps - center) ** (1 / power)
        values = np.linspace(start, stop, count + 1) ** power
        offsets = np.unique(values.real.astype(np.int32))[1:-1]
        steps = [0] + [int(o) + center for o in offsets]
        if len(steps) == count:
            return steps
        power -= 0.02
    return None


def full_steps(num_steps: int, interval: int, schedule: str, warmup: int) -> frozenset[int]:
    """Steps that run the whole UNet."""
    if interval == 1 or num_steps <= 1:
        steps = list(range(num_steps))
    elif schedule == "uniform":
        steps = list(range(0, num_steps, interval))
    else:
        count = math.ceil(num_steps / interval)
        steps = quad_center_steps(num_steps, count, round(QUAD_CENTER * num_steps))
        steps = steps or list(range(0, num_steps, interval))  # too few steps to space: fall back to uniform
    return frozenset(steps) | frozenset(range(min(warmup, num_steps)))


def last_full_steps(steps: frozenset[int], num_steps: int) -> list[int]:
    """Per step ``0..num_steps``, the last full step at or before it (the last entry serves any later step)."""
    found, last = [], 0
    for step in range(num_steps):
        last = step if step in steps else last
        found.append(last)
    return [*found, max(steps, default=0)]


@dataclass
class _Plan:
    skipped: list[tuple[str, torch.nn.Module]]  # modules that return a placeholder on cached steps
    source: tuple[str, torch.nn.Module]  # module whose output is the cached deep feature
    num_branches: int
    branch: int = 0  # skips 0..branch stay live on cached steps (ControlNet residuals are added to them)
    mid_skipped: bool = True  # the mid block returns a placeholder (its ControlNet residual is dropped)
    adapter_live: tuple[bool, ...] = ()  # per down block: its T2I-Adapter residual lands on a live feature


def plan(unet, branch: int) -> _Plan:
    """Which modules to skip and which one feeds the cached feature, for skip branch ``branch``."""
    down, up = list(unet.down_blocks), list(unet.up_blocks)
    for kind, blocks in (("down", down), ("up", up)):
        for i, block in enumerate(blocks):
            if not hasattr(block, "resnets") or hasattr(block, "skip_conv"):
                raise UnsupportedModelError(
                    f"deepcache: {kind}_blocks[{i}] ({type(block).__name__}) has no plain resnet layers; "
                    "supported: UNet blocks with resnets/attentions/samplers (SD, SDXL, DDPM-style)"
                )
    # Skip producers in the order the UNet appends them: conv_in, then each down layer and downsampler.
    producers: list[tuple[int, list[tuple[str, torch.nn.Module]]]] = []  # (down block, modules)
    for d, block in enumerate(down):
        attentions = list(getattr(block, "attentions", None) or [])
        for j, resnet in enumerate(block.resnets):
            layer = [(f"down_blocks.{d}.resnets.{j}", resnet)]
            if j < len(attentions):
                layer.append((f"down_blocks.{d}.attentions.{j}", attentions[j]))
            producers.append((d, layer))
        if getattr(block, "downsamplers", None):
            producers.append((d, [(f"down_blocks.{d}.downsamplers.{k}", m) for k, m in enumerate(block.downsamplers)]))
    num_branches = 1 + len(producers)
    consumers = [(u, i) for u in reversed(range(len(up))) for i in reversed(range(len(up[u].resnets)))]
    if len(consumers) != num_branches:
        raise UnsupportedModelError(
            f"deepcache: {type(unet).__name__} has {num_branches} skip features but {len(consumers)} up-resnets"
        )
    if not 0 <= branch < num_branches:
        raise AcceleratorError(
            f"deepcache: branch={branch} is out of range; this {type(unet).__name__} has skip branches "
            f"0..{num_branches - 1} (0 = shallowest)"
        )
    skipped: list[tuple[str, torch.nn.Module]] = []
    # Down side: a whole block when all its skips are deeper than the branch, otherwise its deeper layers.
    for d, block in enumerate(down):
        mine = [(k + 1, mods) for k, (owner, mods) in enumerate(producers) if owner == d]
        if mine[0][0] > branch:
            skipped.append((f"down_blocks.{d}", block))
        else:
            skipped += [m for k, mods in mine if k > branch for m in mods]
    # Up side: the up-resnet (u, i) consuming skip `branch` runs; whatever feeds it is the cached source.
    u, i = consumers[branch]
    block = up[u]
    attentions = list(getattr(block, "attentions", None) or [])
    if i > 0:
        skipped += [(f"up_blocks.{u}.resnets.{k}", r) for k, r in enumerate(block.resnets[: i - 1])]
        skipped += [(f"up_blocks.{u}.attentions.{k}", a) for k, a in enumerate(attentions[: i - 1])]
        if i - 1 < len(attentions):
            skipped.append((f"up_blocks.{u}.resnets.{i - 1}", block.resnets[i - 1]))
            source = (f"up_blocks.{u}.attentions.{i - 1}", attentions[i - 1])
        else:
            source = (f"up_blocks.{u}.resnets.{i - 1}", block.resnets[i - 1])
    elif u > 0:
        source = (f"up_blocks.{u - 1}", up[u - 1])
    else:
        source = ("mid_block", unet.mid_block)
    skipped += [(f"up_blocks.{k}", up[k]) for k in range(max(u - 1, 0) if i == 0 else u)]
    if unet.mid_block is not None and source[0] != "mid_block":
        skipped.append(("mid_block", unet.mid_block))
    if source[1] is None:
        raise UnsupportedModelError(f"deepcache: {type(unet).__name__} has no mid block to cache at branch {branch}")
    names = {n for n, _ in skipped}
    adapter_live = tuple(
        f"down_blocks.{d}" not in names and _adapter_target(d, block) not in names for d, block in enumerate(down)
    )
    return _Plan(skipped, source, num_branches, branch, "mid_block" in names, adapter_live)


def _adapter_target(d: int, block) -> str:
    # UNet2DConditionModel adds block d's adapter residual to its last layer's output (cross-attention
    # blocks) or to the block's output (the others).
    last = len(block.resnets) - 1
    if getattr(block, "has_cross_attention", False):
        kind = "attentions" if len(getattr(block, "attentions", None) or []) > last else "resnets"
        return f"down_blocks.{d}.{kind}.{last}"
    if getattr(block, "downsamplers", None):
        return f"down_blocks.{d}.downsamplers.{len(block.downsamplers) - 1}"
    return f"down_blocks.{d}.resnets.{last}"


def trim_residuals(layout: _Plan, kwargs: dict) -> dict:
    """On a cached step, ControlNet/T2I-Adapter residuals of skipped features become empty (nothing to add to)."""
    res = kwargs.get("down_block_additional_residuals")
    if res is not None:
        kwargs["down_block_additional_residuals"] = tuple(
            r if k <= layout.branch else r[:, :0] for k, r in enumerate(res)
        )
    mid = kwargs.get("mid_block_additional_residual")
    if mid is not None and layout.mid_skipped:
        kwargs["mid_block_additional_residual"] = mid[:, :0]
    intra = kwargs.get("down_intrablock_additional_residuals")
    if intra is not None:
        live = layout.adapter_live + (False,) * max(0, len(intra) - len(layout.adapter_live))
        kwargs["down_intrablock_additional_residuals"] = [r if ok else r[:, :0] for r, ok in zip(intra, live)]
    return kwargs


SOURCE = "source"  # the store of the cached deep feature


class _State:
    def __init__(self, config: DeepCache, layout: _Plan):
        self.config, self.layout, self.reuse = config, layout, False
        self.steps: frozenset[int] | None = None  # full-compute steps of this call, set at its first evaluation
        self.last_full: list[int] = []  # per step of this call: the last full step at or before it
        self.batch, self.branches = 0, ("cond",)
        self.templates: dict[str, object] = {}
        # (key, batch) -> placeholder, made once per call
        self.placeholders: dict[tuple[str, int], object] = {}
        self.saved = BranchState()  # the source's output per guidance branch


def _template(output):
    """Spatial shape/dtype of each tensor of a module output (tuples kept), to rebuild cheap placeholders."""
    if isinstance(output, torch.Tensor):
        return (tuple(output.shape[2:]), output.dtype, output.device)
    if isinstance(output, tuple):
        return tuple(_template(o) for o in output)
    return output


def _placeholder(template, batch: int):
    # Zero channels: torch.cat with other placeholders stays free and nothing downstream computes.
    if isinstance(template, tuple) and len(template) == 3 and isinstance(template[1], torch.dtype):
        spatial, dtype, device = template
        return torch.empty((batch, 0, *spatial), dtype=dtype, device=device)
    if isinstance(template, tuple):
        return tuple(_placeholder(t, batch) for t in template)
    return template


class _Controller(StatefulHook):
    """On the UNet: clears state per call and decides whether this evaluation reuses the cache."""

    def __init__(self, context, state: _State):
        super().__init__()
        self.context, self.state = context, state

    def reset_state(self, module):
        self.state.templates, self.state.placeholders, self.state.steps = {}, {}, None
        self.state.saved.clear()
        return module

    def pre_forward(self, module, *args, **kwargs):
        ctx, st, config = self.context, self.state, self.state.config
        if st.steps is None:  # the call's step count is known from its first evaluation on
            st.steps = full_steps(ctx.num_steps, config.interval, config.schedule, config.warmup)
            st.last_full = last_full_steps(st.steps, ctx.num_steps)
        sample = args[0] if args else kwargs["sample"]
        st.batch, st.branches = sample.shape[0], ctx.branches
        last_full = st.last_full[min(ctx.step, len(st.last_full) - 1)]
        chunk = st.batch // len(st.branches)
        st.reuse = ctx.step not in st.steps and st.saved.store(SOURCE).has(st.branches, since=last_full, chunk=chunk)
        if st.reuse:
            kwargs = trim_residuals(st.layout, kwargs)
        return args, kwargs


class _Skip(ModelHook):
    """On a deep module: a placeholder on cached steps; on full steps runs and notes its output shape."""

    def __init__(self, state: _State, key: str):
        super().__init__()
        self.state, self.key = state, key

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        if st.reuse:
            made = st.placeholders.get((self.key, st.batch))
            if made is None:  # zero-channel tensors hold no data: one per call and batch serves every step
                made = st.placeholders[self.key, st.batch] = _placeholder(st.templates[self.key], st.batch)
            return made
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.key not in st.templates:  # shapes hold within a call (the state is cleared at every call)
            st.templates[self.key] = _template(output)
        return output


class _Source(ModelHook):
    """On the module feeding the kept up-resnets: stores its output per branch, or returns the stored one."""

    def __init__(self, context, state: _State):
        super().__init__()
        self.context, self.state = context, state

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        if st.reuse:
            feature = st.saved.store(SOURCE).get(st.branches)
            return (feature,) if st.templates["source.tuple"] else feature
        output = self.fn_ref.original_forward(*args, **kwargs)
        is_tuple = isinstance(output, tuple)
        st.templates["source.tuple"] = is_tuple
        st.saved.store(SOURCE).put(st.branches, self.context.step, output[0] if is_tuple else output)
        return output


@register
@dataclass(frozen=True)
class DeepCache(Accelerator):
    """Reuse a UNet's deep features between full passes. Example: ``deepcache(interval=3,branch=0)``."""

    interval: int = option(3, ge=1)
    branch: int = option(0, ge=0)
    schedule: Literal["uniform", "nonuniform"] = "uniform"
    warmup: int = option(0, ge=0)

    spec_name = "deepcache"
    kind = "cache"
    touches = frozenset({"denoiser.forward", "denoiser.blocks"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.blocks"})

    def apply(self, fp: FastPipeline) -> Handle:
        unet = fp.denoiser
        facts = denoiser_facts(unet, "deepcache")
        if facts.family != "unet":
            raise UnsupportedModelError(
                f"deepcache needs a UNet with skip branches; {type(unet).__name__} is a {facts.family} "
                "(use blockcache for transformers)"
            )
        layout = plan(unet, self.branch)
        state = _State(self, layout)
        hooks = [(module, _Skip(state, key)) for key, module in layout.skipped]
        hooks += [(layout.source[1], _Source(fp.context, state)), (unet, _Controller(fp.context, state))]
        group = install_hooks(hooks, "fastdiff.deepcache", fp.context)
        group.info.update(plan=layout, state=state)
        return group
