"""Structured pruning (torch-pruning) for diffusers UNets and DiTs (weight sparsity: ``fastdiff.compress.sparsity``).

``prune(ratio=0.5, importance=magnitude|taylor)`` removes whole channels from a ``UNet2DModel`` or
``UNet2DConditionModel`` and leaves a smaller dense UNet that runs at every batch size and resolution the
original did. DiTs keep their hidden width and lose MLP channels and whole heads (``prune_dit``: also how they
are saved). For UNets it is built on torch-pruning's ``DependencyGraph`` traced with the pipeline's own
denoiser inputs (captured from a one-step call). What it keeps fixed and why:

- ``conv_out`` outputs, the time/class/added embeddings (their width is ``time_embedding_dim``, written to the
  config), and the cross-attention inputs (the text encoder's width);
- ``GroupNorm``: when every group can lose the same number of channels (``c * (1 - ratio)`` whole for
  ``c`` channels per group), every norm keeps its group count (torch-pruning's grouped pruning); otherwise
  (e.g. 32 channels in 32 groups) whole groups go, ranked by their mean importance, and the group count
  shrinks by the ratio everywhere (``norm_num_groups`` in the config);
- attention keeps diffusers' head layout: ``UNet2DModel`` with an ``attention_head_dim`` loses whole heads,
  the others lose head dimensions; GEGLU and scale-shift projections are pruned in both halves alike.
- the sinusoidal time projection (as wide as the first block) keeps, for each frequency of the narrower
  projection, the nearest one of the wider: exactly the same frequencies when the first width is divided by
  an integer and ``freq_shift == 0``.

The config is updated (``block_out_channels``, ``time_embedding_dim``, ``norm_num_groups``), so
``save_pretrained`` and ``from_pretrained`` of the pruned UNet work; ``handle.config_exact`` says whether
diffusers rebuilds exactly this structure from that config (checked on the meta device; a warning names the
difference otherwise, e.g. for ratios that leave widths no config can express). The handle also reports
``params_before/after`` and ``macs_before/after``. ``remove()`` puts the original modules back.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("prune(ratio=0.5)")
    print(handle.handles[0].params_after / handle.handles[0].params_before)
    handle.remove()
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from fastdiff.compress.common import (
    PruningCopies,
    config_mismatch,
    count_params_macs,
    refuse_hooked_blocks,
    sized_handle,
    taylor_gradients,
    trace_inputs,
)
from fastdiff.compress.prune_dit import prune_transformer, transformer_blocks
from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.train.inputs import capture_inputs

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

SUPPORTED = ("UNet2DModel", "UNet2DConditionModel")
# Modules whose output width must not change (time/condition embedding width, output image channels).
_FIXED = ("conv_out", "time_embedding", "class_embedding", "add_embedding", "encoder_hid_proj")


def check_prunable(denoiser, accelerator: str) -> None:
    """UnsupportedModelError unless the denoiser is a UNet or a BasicTransformerBlock stack this module prunes."""
    facts = denoiser_facts(denoiser, accelerator)
    name = type(denoiser).__name__
    if name not in SUPPORTED and not transformer_blocks(denoiser):
        raise UnsupportedModelError(
            f"{accelerator} prunes the channels of {', '.join(SUPPORTED)} and the heads and MLP widths of "
            f"transformers made of BasicTransformerBlocks; {name} is a {facts.family} of neither kind"
        )


@register
@dataclass(frozen=True)
class Prune(Accelerator):
    """Structured pruning to a smaller dense UNet or transformer. Example: ``fp.accelerate("prune(ratio=0.5)")``."""

    ratio: float = option(0.5, gt=0, lt=1)
    importance: Literal["magnitude", "taylor"] = "magnitude"

    spec_name = "prune"
    needs = ("torch_pruning",)
    kind = "compress"
    rebuilt_from_config = True
    touches = frozenset({"denoiser.weights", "denoiser.structure"})
    runs_on_xla = True
    exclusive = frozenset({"denoiser.weights", "denoiser.structure"})

    def apply(self, fp: FastPipeline) -> Handle:
        den = fp.denoiser
        check_prunable(den, "prune")
        if den._parameters or den._buffers:
            raise UnsupportedModelError(f"prune: {type(den).__name__} holds tensors outside its submodules")
        refuse_hooked_blocks(den, "prune")
        if type(den).__name__ not in SUPPORTED:  # transformers: heads and MLP widths (prune_dit)
            return prune_transformer(fp, self)
        inputs = capture_inputs(fp, batch=2)
        residuals = [k for k in RESIDUAL_INPUTS if inputs.get(k) is not None]
        if residuals:
            raise UnsupportedModelError(
                f"prune: {type(fp.pipe).__name__} feeds the UNet {', '.join(residuals)} (ControlNet / T2I-Adapter) "
                "whose widths must match the UNet's; pruning channels would break them"
            )
        before = count_params_macs(den, inputs)
        config, trainable = den._internal_dict, any(p.requires_grad for p in den.parameters())
        copies = PruningCopies(den)  # prune copies; the originals come back on remove()

        def restore():
            copies.restore()
            den._internal_dict = config

        try:
            with torch.enable_grad():  # torch-pruning traces the graph through autograd
                den.requires_grad_(True)
                new_config = _prune_unet(den, inputs, self, fp)
                gc.collect()  # torch-pruning's graph sits in reference cycles: free its trace now, not at gen 2
                den.requires_grad_(trainable)
            set_config(den, new_config)
            problem = config_mismatch(den)
            den.zero_grad(set_to_none=True)
            copies.finish()
            handle = sized_handle(  # runs the pruned UNet once: a ratio it cannot run at fails here
                restore,
                den,
                inputs,
                before,
                block_out_channels=tuple(new_config["block_out_channels"]),
                config_exact=problem is None,
            )
        except (RuntimeError, ZeroDivisionError, IndexError) as error:  # channel counts it cannot take
            restore()
            raise AcceleratorError(
                f"prune: ratio {self.ratio:g} leaves this {type(den).__name__} unable to run "
                f"({type(error).__name__}: {error}); choose a ratio that keeps whole GroupNorm groups and heads, "
                "e.g. 0.25 or 0.5"
            ) from error
        except BaseException:
            restore()
            raise
        if problem:
            warnings.warn(f"prune: the pruned UNet differs from what its config rebuilds ({problem})", stacklevel=3)
        return handle


# Inputs through which other models (ControlNet, T2I-Adapter) add features of the UNet's own widths.
RESIDUAL_INPUTS = (
    "down_block_additional_residuals",
    "mid_block_additional_residual",
    "down_intrablock_additional_residuals",
)


def _forward(model, inputs):
    # The class forward, not the instance's: skips the wrapper's hooks (step counting) while tracing.
    return type(model).forward(model, **inputs, return_dict=False)[0]


def _prune_unet(den, inputs: dict, config: Prune, fp) -> dict:
    import torch_pruning as tp
    from diffusers.models.attention_processor import Attention

    ratio = config.ratio - 1e-9  # so that int(n * (1 - ratio)) is not lost to rounding (10 * 0.1 = 0.999..)
    keep = 1 - ratio
    old_c0 = den.conv_in.out_channels
    temb_dim = den.time_embedding.linear_2.out_features
    ignored = [m for n in _FIXED if isinstance(m := getattr(den, n, None), nn.Module)]
    norms = {m: m.num_channels // m.num_groups for m in den.modules() if isinstance(m, nn.GroupNorm)}
    # Keep every norm's group count when each group can lose the same number of channels; otherwise (e.g.
    # one channel per group) remove whole groups: the group count shrinks by the same ratio everywhere.
    whole_groups = not all(per * keep >= 1 and _integral(per * keep) for per in norms.values())
    out_groups = _paired_projections(den)
    attns = [m for m in den.modules() if isinstance(m, Attention)]
    num_heads = {lin: a.heads for a in attns for lin in (a.to_q, a.to_k, a.to_v)}
    head_dims = {a: a.inner_dim // a.heads for a in attns}
    # UNet2DModel derives heads = width // attention_head_dim: remove whole heads to keep head_dim.
    whole_heads = type(den).__name__ == "UNet2DModel" and den.config.attention_head_dim is not None
    head_ratios = {}
    if whole_heads:
        for a in attns:
            groups, width = a.group_norm.num_groups, a.group_norm.num_channels
            kept = int(width * keep) if whole_groups else groups * int(width // groups * keep)
            removed = a.heads - kept // head_dims[a]
            head_ratios[a] = max(removed - 0.5, 0) / a.heads  # torch-pruning removes ceil(ratio * heads)
    base = tp.importance.GroupTaylorImportance() if config.importance == "taylor" else None
    base = base or tp.importance.GroupMagnitudeImportance(p=2)
    pruner = tp.pruner.MetaPruner(
        den,
        trace_inputs(den, inputs),
        importance=_GroupMean(base, norms) if whole_groups else base,
        pruning_ratio=ratio,
        ignored_layers=ignored,
        forward_fn=_forward,
        in_channel_groups={},  # torch-pruning's default is one dict shared by every pruner
        out_channel_groups=out_groups,
        num_heads=num_heads,
        prune_num_heads=whole_heads,
        prune_head_dims=not whole_heads,
        head_pruning_ratio_dict=head_ratios or None,
    )
    if whole_groups:  # plain channel ranking (group means) instead of torch-pruning's per-group positions
        for table in (pruner.out_channel_groups, pruner.in_channel_groups):
            for m in [m for m in table if isinstance(m, nn.GroupNorm)]:
                del table[m]
    if config.importance == "taylor":
        taylor_gradients(den, fp, inputs)
    pruner.step()
    return _fix_up(den, attns, head_dims, whole_heads, norms, whole_groups, old_c0, temb_dim)


def _fix_up(den, attns, head_dims, whole_heads, norms, whole_groups, old_c0, temb_dim) -> dict:
    """Update the diffusers layers that store channel counts; return the config entries that changed."""
    import torch_pruning as tp
    from diffusers.models.embeddings import Timesteps
    from diffusers.models.resnet import Downsample2D, ResnetBlock2D, Upsample2D

    for m, per in norms.items():
        m.num_groups = max(1, m.num_channels // per) if whole_groups else m.num_groups
    for m in den.modules():
        if isinstance(m, (Downsample2D, Upsample2D)) and isinstance(getattr(m, "conv", None), nn.Conv2d):
            m.channels, m.out_channels = m.conv.in_channels, m.conv.out_channels
        elif isinstance(m, ResnetBlock2D):
            m.in_channels, m.out_channels = m.conv1.in_channels, m.conv2.out_channels
    for a in attns:
        dim = head_dims[a] if whole_heads else a.to_q.out_features // a.heads
        a.heads = a.to_q.out_features // dim
        a.inner_dim, a.inner_kv_dim = a.to_q.out_features, a.to_k.out_features
        a.query_dim, a.out_dim = a.to_q.in_features, a.to_out[0].out_features
        a.scale = dim**-0.5 if a.scale_qk else 1.0

    new_c0 = den.conv_in.out_channels
    proj = getattr(den, "time_proj", None)
    if new_c0 != old_c0 and isinstance(proj, Timesteps) and new_c0 % 2 == 0 and old_c0 % 2 == 0:
        # Timesteps(c) uses frequencies exp(-log(1e4) k / (c/2 - shift)), k < c/2. Keep, for each frequency of
        # the narrower projection, the input of linear_1 fed by the nearest one of the wider: the very same
        # frequency when old/new is an integer and shift is 0, else the nearest (recovery absorbs the rest).
        old_half, new_half, shift = old_c0 // 2, new_c0 // 2, proj.downscale_freq_shift
        picks = [round(k * (old_half - shift) / (new_half - shift)) for k in range(new_half)]
        keep = set(picks + [old_half + k for k in picks])
        tp.prune_linear_in_channels(den.time_embedding.linear_1, [i for i in range(old_c0) if i not in keep])
        proj.num_channels = new_c0
    widths = [block.resnets[-1].conv2.out_channels for block in den.down_blocks]
    config = {"block_out_channels": widths, "time_embedding_dim": temb_dim}
    if whole_groups and isinstance(getattr(den, "conv_norm_out", None), nn.GroupNorm):
        config["norm_num_groups"] = den.conv_norm_out.num_groups
        if den.config.get("attn_norm_num_groups"):
            config["attn_norm_num_groups"] = next(a.group_norm.num_groups for a in attns)
    return config


def _integral(x: float) -> bool:
    return abs(x - round(x)) < 1e-6


def _paired_projections(den) -> dict:
    """Layers whose output is chunked in two (GEGLU, scale-shift time projections): prune both halves alike."""
    from diffusers.models.resnet import ResnetBlock2D

    out = {}
    for m in den.modules():
        if type(m).__name__ == "GEGLU":
            out[m.proj] = 2
        if isinstance(m, ResnetBlock2D) and m.time_emb_proj is not None and m.time_embedding_norm == "scale_shift":
            out[m.time_emb_proj] = 2
    return out


class _GroupMean:
    """Importance averaged over each GroupNorm group, so that whole groups are removed together."""

    def __init__(self, base, norms: dict):
        self.base, self.norms = base, norms

    def __call__(self, group):
        imp = self.base(group)
        if imp is None:
            return None
        for dep, _ in group:
            per = self.norms.get(dep.target.module)
            if per and dep.target.module.num_channels == len(imp):
                return imp.view(-1, per).mean(1).repeat_interleave(per)
        return imp


def set_config(module, values: dict) -> None:
    """Update a diffusers model's config (also where from_config would fall back to a default)."""
    defaults = module.config.get("_use_default_values")
    if defaults is not None:
        values = dict(values, _use_default_values=[k for k in defaults if k not in values])
    module.register_to_config(**values)
