"""Token merging (ToMe for SD, Bolya & Hoffman 2023) in the self-attention of UNets and DiTs, on hooks.

Before a self-attention layer at a shallow enough level (downsample <= ``max_downsample``), the tokens are split
into dst (one random token per ``sx`` x ``sy`` cell) and src; the ``ratio * N`` src tokens most similar (cosine,
on the block's input) to some dst token are averaged into it, attention runs on the remaining tokens, and its
output is copied back to every merged token. This is tomesd 0.1.3's algorithm (``bipartite_soft_matching_random2d``
+ its ``BasicTransformerBlock`` patch) rebuilt from hooks: a pre-forward on the block computes the matching, hooks
on ``attn1`` (and ``attn2`` / ``ff`` with ``merge_cross`` / ``merge_mlp``) merge their input and unmerge their
output. UNet2DModel's residual ``Attention`` layers (DDPM, the digits model) are merged after their group norm and
their residual is re-added at full resolution. The random dst choice uses a generator of its own, reseeded at every
pipeline call, so sampling randomness is untouched and every call is reproducible.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("tome(ratio=0.5)")
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()  # outputs are bit-identical to before
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.diffusers_compat import StatefulHook
from fastdiff.core.hooks import Handle, HandleGroup, all_or_nothing, install_hook
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

_SEED = 0  # the dst choice is reseeded with this at the start of every pipeline call


class MergePlan:
    """One bipartite matching: ``merge`` (B, N, C) -> (B, N - r, C) and ``unmerge`` back to (B, N, C).

    The values equal tomesd's ``bipartite_soft_matching_random2d``; the indexing is ours because it is the
    overhead that eats the saving: every merge and unmerge is flat row gathers (``index_select``/``index_add_``)
    prepared here in few operations, with the batch offsets kept per shape (``constants``).
    """

    def __init__(self, metric: torch.Tensor, h: int, w: int, sx: int, sy: int, r: int, generator=None, constants=None):
        B, N, _ = metric.shape
        device = metric.device
        with torch.no_grad():
            a_idx, b_idx = _dst_split(h, w, sx, sy, generator, device)
            num_dst = b_idx.numel()
            r = min(a_idx.numel(), r)
            M = N - r  # tokens after merging: unmerged src, then dst
            unm_len = M - num_dst
            const = _constants(constants, B, N, num_dst, r, device)
            metric = metric.contiguous()  # a block input is often a strided view (B, HW, C): norms on it are slow
            metric = metric / metric.norm(dim=-1, keepdim=True)
            scores = metric.index_select(1, a_idx) @ metric.index_select(1, b_idx).transpose(-1, -2)
            node_max, node_idx = scores.max(dim=-1)  # one pass for best value and dst (no copy of the rows)
            edge_idx = node_max.argsort(dim=-1, descending=True)  # src rows, most similar first
            src_rows = edge_idx[:, :r]
            tokens = a_idx[edge_idx]  # src tokens, most similar first
            dst_row = node_idx.gather(1, src_rows) + unm_len  # merged row of each merged src token
            flat = tokens + const["offset_in"]
            self.src_flat = flat[:, :r].reshape(-1)
            # merged rows as flat input rows: the unmerged src tokens, then the dst tokens
            self.keep_flat = torch.cat([flat[:, r:], b_idx + const["offset_in"]], dim=1).view(-1)
            self.add_flat = (dst_row + const["offset_out"]).view(-1)
            self.counts = const["ones_out"].clone().index_add_(0, self.add_flat, const["ones_src"])[:, None]
            # row of each token after merging: a merged src reads its dst
            where = torch.cat([tokens, b_idx.expand(B, -1)], dim=1)
            rows = torch.cat([dst_row, const["unm_rows"], const["dst_rows"]], dim=1)
            source = torch.empty(B, N, dtype=torch.int64, device=device).scatter_(1, where, rows)
            self.source_flat = (source + const["offset_out"]).view(-1)
        self.r, self.tokens, self.merged = r, N, M

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        B, N, c = x.shape
        flat = x.reshape(B * N, c)
        out = flat.index_select(0, self.keep_flat).index_add_(0, self.add_flat, flat.index_select(0, self.src_flat))
        return (out / self.counts.to(x.dtype)).view(B, self.merged, c)

    def unmerge(self, x: torch.Tensor) -> torch.Tensor:
        B, _, c = x.shape
        return x.reshape(-1, c).index_select(0, self.source_flat).view(B, self.tokens, c)


def _dst_split(h: int, w: int, sx: int, sy: int, generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """src and dst token indices: one dst per (sy, sx) cell (random with a generator, else the top-left token),
    ordered as tomesd's argsort orders them (its sort is not stable, so the same tensor is sorted)."""
    hsy, wsx = h // sy, w // sx
    if generator is not None:
        cell = torch.randint(sy * sx, (hsy, wsx, 1), generator=generator).to(device)
    else:
        cell = torch.zeros(hsy, wsx, 1, dtype=torch.int64, device=device)
    view = -(torch.arange(sy * sx, device=device) == cell).long()  # -1 at the dst of each cell
    view = view.view(hsy, wsx, sy, sx).transpose(1, 2).reshape(hsy * sy, wsx * sx)
    if hsy * sy < h or wsx * sx < w:  # the grid does not divide by the strides: the rest is src
        full = torch.zeros(h, w, dtype=torch.int64, device=device)
        full[: hsy * sy, : wsx * sx] = view
        view = full
    order = view.reshape(1, -1, 1).argsort(dim=1).view(-1)  # dst (-1) first, then src (0)
    return order[hsy * wsx :], order[: hsy * wsx]


def _constants(cache: dict | None, B: int, N: int, num_dst: int, r: int, device) -> dict[str, torch.Tensor]:
    """The tensors a plan needs that depend only on its shape (kept in ``cache`` across plans)."""
    key = (B, N, num_dst, r, device)
    if cache is not None and key in cache:
        return cache[key]
    M = N - r
    batch = torch.arange(B, device=device)[:, None]
    rows = torch.arange(M, device=device)
    const = {
        "offset_in": batch * N,
        "offset_out": batch * M,
        "ones_out": torch.ones(B * M, device=device),
        "ones_src": torch.ones(B * r, device=device),
        "unm_rows": rows[: M - num_dst].expand(B, -1),
        "dst_rows": rows[M - num_dst :].expand(B, -1),
    }
    if cache is not None:
        cache[key] = const
    return const


class _State:
    """Shared by every hook of one application: token grid of the current call and the dst generator."""

    def __init__(self, config: ToMe, context, patch: int):
        self.config, self.context, self.patch = config, context, patch
        self.size: tuple[int, int] | None = None
        self.generator = torch.Generator().manual_seed(_SEED)  # reseeded at each call (_SizeHook.reset_state)
        self.constants: dict = {}  # shape-only tensors of the plans (MergePlan's ``constants``)

    def plan(self, tokens: torch.Tensor, level: int, size: tuple[int, int] | None = None) -> MergePlan | None:
        if size is None and self.size is None:  # called outside a denoiser call: nothing to size the grid by
            return None
        H, W = size or self.size
        h, w = math.ceil(H / level), math.ceil(W / level)
        if h * w != tokens.shape[1]:  # an unexpected layout: leave this layer alone
            return None
        if h < self.config.sy or w < self.config.sx:  # smaller than one merge cell: nothing to merge into
            return None
        c = self.config
        # tomesd: an odd batch cannot hold both guidance branches; random dst then causes artifacts.
        generator = self.generator if c.use_rand and tokens.shape[0] % 2 == 0 else None
        r = int(tokens.shape[1] * c.ratio)
        return MergePlan(tokens, h, w, c.sx, c.sy, r, generator, self.constants) if r > 0 else None


class _SizeHook(StatefulHook):
    """On the denoiser: the token grid of this call (latent size over the patch size); reseeds the dst choice."""

    def __init__(self, state: _State):
        super().__init__()
        self.state = state

    def reset_state(self, module):
        self.state.generator.manual_seed(_SEED)
        return module

    def pre_forward(self, module, *args, **kwargs):
        x = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
        if isinstance(x, torch.Tensor) and x.dim() == 4:  # block-level units size their grid by it
            self.state.size = (x.shape[-2] // self.state.patch, x.shape[-1] // self.state.patch)
        return args, kwargs


class _Slot:
    plan: MergePlan | None = None


class _BlockHook(ModelHook):
    """On a transformer block: the matching for this call of the block, from its input tokens."""

    def __init__(self, state: _State, level: int, slot: _Slot):
        super().__init__()
        self.state, self.level, self.slot = state, level, slot

    def pre_forward(self, module, *args, **kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        self.slot.plan = self.state.plan(x, self.level)
        return args, kwargs

    def post_forward(self, module, output):
        self.slot.plan = None
        return output


class _MergeHook(ModelHook):
    """On attn1/attn2/ff of a block: merge the input tokens, unmerge the output."""

    def __init__(self, slot: _Slot):
        super().__init__()
        self.slot = slot

    def pre_forward(self, module, *args, **kwargs):
        plan = self.slot.plan
        if plan is not None:
            if args:
                args = (plan.merge(args[0]), *args[1:])
            else:
                kwargs["hidden_states"] = plan.merge(kwargs["hidden_states"])
        return args, kwargs

    def post_forward(self, module, output):
        plan = self.slot.plan
        return output if plan is None else plan.unmerge(output)


class _ResidualAttentionHook(ModelHook):
    """On a UNet2DModel ``Attention`` (group norm and residual inside): merge after the norm, fix the residual."""

    def __init__(self, state: _State):
        super().__init__()
        self.state = state
        self.saved = None  # (full tokens, merged normed tokens, plan, 4D shape) during one call

    def pre_forward(self, module, *args, **kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        if x.ndim != 4:
            return args, kwargs
        B, C, H, W = x.shape
        tokens = x.view(B, C, H * W).transpose(1, 2)
        plan = self.state.plan(tokens, 1, size=(H, W))
        if plan is None:
            return args, kwargs
        normed = tokens
        if module.group_norm is not None:  # normalize at full resolution; the norm hook then passes through
            normed = module.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
        merged = plan.merge(normed)
        self.saved = (tokens, merged, plan, x.shape)
        if args:
            return (merged, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": merged}

    def post_forward(self, module, output):
        if self.saved is None:
            return output
        tokens, merged, plan, shape = self.saved
        self.saved = None
        delta = output * module.rescale_output_factor
        if module.residual_connection:  # the processor added the merged input; re-add the full one
            delta = delta - merged
        out = plan.unmerge(delta)
        if module.residual_connection:
            out = out + tokens
        out = out / module.rescale_output_factor
        return out.transpose(1, 2).reshape(shape)


class _SkipNormHook(ModelHook):
    """On the group norm of a merged ``Attention``: its input was normalized before merging."""

    def __init__(self, owner: _ResidualAttentionHook):
        super().__init__()
        self.owner = owner

    def new_forward(self, module, *args, **kwargs):
        if self.owner.saved is not None:
            return args[0]
        return self.fn_ref.original_forward(*args, **kwargs)


def unet_levels(denoiser) -> dict[str, int]:
    """Downsample factor of each down/mid/up block of a diffusers UNet, by attribute path."""
    levels, level = {}, 1
    for i, block in enumerate(denoiser.down_blocks):
        levels[f"down_blocks.{i}"] = level
        if getattr(block, "downsamplers", None):
            level *= 2
    levels["mid_block"] = level
    for i, block in enumerate(denoiser.up_blocks):
        levels[f"up_blocks.{i}"] = level
        if getattr(block, "upsamplers", None):
            level //= 2
    return levels


@register
@dataclass(frozen=True)
class ToMe(Accelerator):
    """Token merging in self-attention (tomesd's algorithm on hooks). Example: ``fp.accelerate("tome(ratio=0.5)")``.

    ``ratio``: fraction of tokens merged away (at most 1 - 1/(sx*sy)); ``max_downsample``: merge only in layers
    whose resolution is at most this many times below the latent (1, 2, 4 or 8); ``sx``/``sy``: dst stride;
    ``merge_cross``/``merge_mlp``: also merge before the cross-attention / feed-forward (tomesd's
    merge_crossattn / merge_mlp; both cost quality); ``use_rand``: random dst per cell (else top-left).
    """

    ratio: float = 0.5
    max_downsample: int = option(1, choices=(1, 2, 4, 8))
    sx: int = option(2, ge=1)
    sy: int = option(2, ge=1)
    merge_cross: bool = False
    merge_mlp: bool = False
    use_rand: bool = True

    spec_name = "tome"
    kind = "attention"
    # denoiser.tokens: it merges tokens, so it is refused beside a sequence split
    touches = frozenset({"denoiser.attention", "denoiser.tokens"})
    runs_on_xla = True

    def validate(self) -> None:
        if self.sx * self.sy < 2:
            raise AcceleratorError(f"tome: sx and sy must be >= 1 with sx*sy >= 2, got sx={self.sx}, sy={self.sy}")
        limit = 1 - 1 / (self.sx * self.sy)
        if not 0 < self.ratio <= limit:
            raise AcceleratorError(
                f"tome: ratio must be in (0, {limit:g}] for sx={self.sx}, sy={self.sy}, got {self.ratio}"
            )

    def apply(self, fp: FastPipeline) -> Handle:
        denoiser = fp.denoiser
        facts = denoiser_facts(denoiser, "tome")
        if not facts.attention_blocks:
            raise UnsupportedModelError(
                f"tome does not support {type(denoiser).__name__}: its blocks attend jointly over text and image "
                "tokens (or through linear attention), and token merging here covers the self-attention of "
                "UNets and of BasicTransformerBlock stacks (DiT, PixArt); use blockcache or forecast instead"
            )
        patch = getattr(denoiser.config, "patch_size", None) or 1
        state = _State(self, fp.context, patch)
        levels = unet_levels(denoiser) if facts.family == "unet" else {}
        units, found = [], set()
        for name, module in denoiser.named_modules():
            if type(module).__name__ not in facts.attention_blocks:
                continue
            if type(module).__name__ == "Attention" and module.is_cross_attention:
                continue
            level = next((lv for prefix, lv in levels.items() if name.startswith(prefix + ".")), 1)
            found.add(level)
            if level <= self.max_downsample:
                units.append((name, module, level))
        if not units:
            raise AcceleratorError(
                f"tome(max_downsample={self.max_downsample}): {type(denoiser).__name__} has self-attention only "
                f"at downsample {', '.join(map(str, sorted(found))) or 'none'}; raise max_downsample to merge"
            )
        with all_or_nothing() as handles:
            for name, module, level in units:
                handles += self._hook_unit(name, module, level, state)
            handles.append(install_hook(denoiser, _SizeHook(state), "fastdiff.tome.size", state.context))
        return HandleGroup(handles)

    def _hook_unit(self, name: str, module, level: int, state: _State) -> list[Handle]:
        if type(module).__name__ == "Attention":
            if self.merge_cross or self.merge_mlp:
                raise AcceleratorError(
                    f"tome: merge_cross/merge_mlp need transformer blocks; {name} is a plain Attention layer"
                )
            if module.spatial_norm is not None:
                raise AcceleratorError(f"tome: {name} has a spatial norm, which token merging does not support")
            hook = _ResidualAttentionHook(state)
            handles = [install_hook(module, hook, "fastdiff.tome", state.context)]
            if module.group_norm is not None:
                handles.append(
                    install_hook(module.group_norm, _SkipNormHook(hook), "fastdiff.tome.norm", state.context)
                )
            return handles
        if self.merge_mlp and getattr(module, "_chunk_size", None) is not None:
            raise AcceleratorError(f"tome: merge_mlp cannot merge the chunked feed-forward of {name}")
        slot = _Slot()
        handles = [install_hook(module, _BlockHook(state, level, slot), "fastdiff.tome", state.context)]
        targets = [module.attn1]
        if self.merge_cross and module.attn2 is not None:
            targets.append(module.attn2)
        if self.merge_mlp:
            targets.append(module.ff)
        handles += [install_hook(t, _MergeHook(slot), "fastdiff.tome", state.context) for t in targets]
        return handles
