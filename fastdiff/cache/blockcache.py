"""Block caching for transformer denoisers (DiT, PixArt, SD3, Flux, Qwen-Image, Z-Image, Sana): first-block
residual caching or fixed-interval reuse.

``mode=first-block`` (First Block Cache, as diffusers' ``hooks/first_block_cache.py``): block 0 always runs;
if the relative L1 change of its residual (output - input) against the last fully computed step is at most
``threshold``, the other blocks are skipped and the residual they added on that step is added instead.
``fit=FIT.json`` takes the threshold fitted for the model within a PSNR budget (``fastdiff fit-first-block``,
``fastdiff.cache.calibrate``); the file is read at apply.
``mode=interval`` (FORA): every ``interval`` steps all blocks run and each block's attention and MLP outputs are
stored; in between they are reused while the cheap timestep-dependent parts (adaLN modulation, gates,
norms) still run. State is kept per guidance branch and cleared at the start of every call.

Blocks that take and return text states beside the image states (Flux's and SD3's dual-stream blocks) are read
through diffusers' block metadata (``fastdiff.core.denoisers.block_io``): the residual is that of the image states,
and a skipped block passes both through. Blocks run in the order of the model's block lists (``DenoiserFacts``).
Where the last blocks return the text tokens joined before the image tokens (Flux.2's single-stream blocks, the
fact ``joined_last_block``), the residual is read from the trailing image tokens; a skipped step passes the
joined sequence through, and the model drops the text part itself.

diffusers' ``apply_first_block_cache`` fails on DiTPipeline ("No cache context is set": neither the pipeline
nor DiTTransformer2DModel sets a ``cache_context``) and keeps one whole-batch state, so the same algorithm is
written here on fastdiff's step context, with per-branch state.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-dit", "test"))
    handle = fp.accelerate("scheduler(name=dpm++2m,steps=6);blockcache(mode=interval,interval=2)")
    images = fp(class_labels=[1, 2], output_type="np").images
    handle.remove()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from diffusers.hooks import ModelHook

from fastdiff.cache.blockcache_teacache import (
    ReuseModulation,
    TeaHead,
    l1_norm,
    load_rescaling,
    modulation_of,
    read_fit,
)
from fastdiff.cache.blockio import blocks_in_order, hidden_in, hidden_out, passed_through, with_hidden
from fastdiff.core.branch_state import BranchState
from fastdiff.core.denoisers import REUSABLE_LAYERS, block_io, denoiser_facts
from fastdiff.core.diffusers_compat import StatefulHook
from fastdiff.core.hooks import Handle, install_hooks
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

DEFAULT_THRESHOLD = 0.05  # first-block and teacache, where neither threshold nor (first-block) fit is given


class _State:
    def __init__(self, config: BlockCache, context, joined: bool = False, threshold: float = DEFAULT_THRESHOLD):
        self.config, self.context, self.threshold = config, context, threshold
        self.joined = joined  # the last block returns [text, image] joined: its image states are the trailing ones
        self.step, self.branches = 0, ("cond",)
        self.skip = False  # first-block, teacache: the (remaining) blocks are skipped in this evaluation
        self.skipped = 0  # evaluations whose blocks were skipped (or reused, in interval mode), since apply
        self.reuse = False  # interval: stored layer outputs are used in this evaluation
        self.saved = BranchState()  # stored outputs by name, per guidance branch; cleared every call
        self.kinds: dict[str, tuple | None] = {}  # interval: None for a tensor output, else the tuple's layout
        self.head_output: torch.Tensor | None = None
        self.scale_of: torch.Tensor | None = None  # first-block: the stored residual whose L1 norm is scale
        self.scale: torch.Tensor | None = None
        self.last_full = 0
        # first-block: per evaluation of this call, (step, change or None on a branch's first, skipped)
        self.trace: list[tuple[int, float | None, bool]] = []
        self.tail_memo: tuple[list[torch.Tensor], torch.Tensor] | None = None  # (stored pair, its residual)

    def tail_residual(self, branches: tuple[str, ...]) -> torch.Tensor:
        """What the blocks after the first added on the last computed step of ``branches``. The last block stores
        its image states with the first block's; only a skipped step needs their difference, so it is taken on
        the first skipped step after a computed one and kept for the next."""
        pair = self.saved.store("tail").get(branches)
        if self.tail_memo is None or self.tail_memo[0] is not pair:
            self.tail_memo = (pair, pair[0] - pair[1])
        return self.tail_memo[1]


class _Controller(StatefulHook):
    """On the transformer: clears state per call; in interval mode decides whether this evaluation reuses."""

    def __init__(self, state: _State):
        super().__init__()
        self.state = state

    def reset_state(self, module):
        st = self.state
        st.head_output, st.last_full, st.trace, st.scale_of, st.scale = None, 0, [], None, None
        st.tail_memo = None
        st.saved.clear()
        return module

    def pre_forward(self, module, *args, **kwargs):
        st, ctx = self.state, self.state.context
        st.step, st.branches, st.skip = ctx.step, ctx.branches, False
        if st.config.mode == "interval":
            if ctx.step % st.config.interval == 0:
                st.last_full = ctx.step
            st.reuse = ctx.step != st.last_full and all(
                st.saved.value("refreshed", b, -1) >= st.last_full for b in ctx.branches
            )
            st.skipped += st.reuse
            if not st.reuse:  # this evaluation refreshes the stored outputs of its branches
                st.saved.set("refreshed", ctx.branches, ctx.step)  # interval: the step they were stored at
        return args, kwargs


class _Head(ModelHook):
    """First-block mode, on block 0: measures the change of its residual and decides whether to skip the rest."""

    def __init__(self, state: _State, io):
        super().__init__()
        self.state, self.io = state, io

    def new_forward(self, module, *args, **kwargs):
        st, io = self.state, self.io
        output = self.fn_ref.original_forward(*args, **kwargs)
        hidden = hidden_out(io, output)
        residual = hidden - hidden_in(io, args, kwargs)
        head, tail = st.saved.store("head"), st.saved.store("tail")
        change = None
        if head.has(st.branches) and tail.has(st.branches):
            previous = head.get(st.branches)
            if st.scale_of is not previous:  # skipped steps compare with the same residual: its scale once
                st.scale_of, st.scale = previous, l1_norm(previous)
            change = (l1_norm(residual - previous) / st.scale).item()  # mean |difference| over mean |previous|
            st.skip = change <= st.threshold
            st.skipped += st.skip
        st.trace.append((st.step, change, st.skip))
        if st.skip:
            return with_hidden(io, output, hidden + st.tail_residual(st.branches))
        head.put(st.branches, st.step, residual)
        st.head_output = hidden
        return output


class _Rest(ModelHook):
    """First-block and teacache modes, on blocks 1..n-1: identity when skipped; the last block stores its image
    states with the first block's (``_State.tail_residual`` subtracts them when a skipped step needs it)."""

    def __init__(self, state: _State, io, last: bool):
        super().__init__()
        self.state, self.io, self.last = state, io, last

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        if st.skip:
            return passed_through(self.io, args, kwargs)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.last:
            hidden = hidden_out(self.io, output)
            if st.joined:
                hidden = hidden[:, -st.head_output.shape[1] :]
            st.saved.store("tail").put(st.branches, st.step, [hidden, st.head_output])
        return output


class _Reuse(ModelHook):
    """Interval mode, on a block's attention/MLP: stores its output on full steps, returns it in between."""

    def __init__(self, state: _State, key: str):
        super().__init__()
        self.state, self.key = state, key

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        if st.reuse:
            stored = st.kinds[self.key]  # a tensor, or a tuple of tensors and Nones (joint attention)
            if stored is None:
                return st.saved.store(self.key).get(st.branches)
            return tuple(None if t is None else st.saved.store(f"{self.key}.{i}").get(st.branches) for i, t in stored)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if isinstance(output, torch.Tensor):
            st.kinds[self.key] = None
            st.saved.store(self.key).put(st.branches, st.step, output)
        else:
            st.kinds[self.key] = tuple((i, t) for i, t in enumerate(output))
            for i, t in enumerate(output):
                if t is not None:
                    st.saved.store(f"{self.key}.{i}").put(st.branches, st.step, t)
        return output


@register
@dataclass(frozen=True)
class BlockCache(Accelerator):
    """Skip or reuse transformer blocks between steps. Example: ``blockcache(mode=first-block,fit=fb.json)``.

    ``threshold`` is used by ``first-block`` and ``teacache`` (none given: 0.05), ``interval`` by ``interval``,
    ``fit`` by ``first-block`` (the fitted threshold, instead of ``threshold``) and ``teacache`` (the rescaling).
    """

    mode: Literal["first-block", "interval", "teacache"] = "first-block"
    threshold: float | None = option(None, ge=0)  # None: DEFAULT_THRESHOLD (first-block: or the fit's)
    interval: int = option(2, ge=1)
    # first-block: the threshold fitted for this model (fastdiff fit-first-block); teacache: the rescaling
    # polynomial fitted for it (fastdiff fit-teacache). Read at apply.
    fit: str | None = None

    spec_name = "blockcache"
    kind = "cache"
    # denoiser.tokens: its skip decision reads the whole token sequence, which sequence parallelism splits
    touches = frozenset({"denoiser.forward", "denoiser.blocks", "denoiser.tokens"})
    exclusive = frozenset({"denoiser.blocks"})

    def validate(self) -> None:
        if self.fit is not None and self.mode == "interval":
            raise AcceleratorError(
                "blockcache: fit is an option of mode=first-block and mode=teacache, not of mode=interval"
            )
        if self.fit is not None and self.mode == "first-block" and self.threshold is not None:
            raise AcceleratorError(
                f"blockcache: give threshold or fit in mode=first-block, not both (the fit {self.fit} holds "
                "the threshold fitted for the model)"
            )

    def apply(self, fp: FastPipeline) -> Handle:
        model = fp.denoiser
        facts = denoiser_facts(model, "blockcache")
        if facts.family != "transformer":
            raise UnsupportedModelError(
                f"blockcache needs a transformer denoiser; {type(model).__name__} is a {facts.family} "
                "(use deepcache for UNets)"
            )
        blocks = blocks_in_order(model, facts)
        if self.mode != "interval" and len(blocks) < 2:
            raise UnsupportedModelError(
                f"blockcache(mode={self.mode}) needs at least 2 blocks; {type(model).__name__} has {len(blocks)}"
            )
        threshold = DEFAULT_THRESHOLD if self.threshold is None else self.threshold
        if self.mode == "first-block" and self.fit is not None:
            threshold = fitted_threshold(self.fit, model)
        state = _State(self, fp.context, joined=facts.joined_last_block, threshold=threshold)
        targets: list[tuple[torch.nn.Module, ModelHook]] = []
        if self.mode != "interval":
            if self.mode == "teacache":
                facts = modulation_of(blocks[0])
                reuse = None if len(facts) > 2 else ReuseModulation()  # the adaLN layer returns the modulated input
                head = TeaHead(state, block_io(blocks[0]), load_rescaling(self.fit, model), facts, reuse)
                if reuse is not None:
                    targets.append((getattr(blocks[0], facts[0]), reuse))
            else:
                head = _Head(state, block_io(blocks[0]))
            targets.append((blocks[0], head))
            targets += [
                (b, _Rest(state, block_io(b), last=i == len(blocks) - 1)) for i, b in enumerate(blocks) if i > 0
            ]
        else:
            for i, block in enumerate(blocks):
                names = REUSABLE_LAYERS.get(type(block).__name__)
                if names is None:
                    raise UnsupportedModelError(
                        f"blockcache(mode=interval) has no reusable layers for {type(block).__name__}"
                    )
                for name in names:
                    layer = getattr(block, name, None)
                    if layer is not None:
                        targets.append((layer, _Reuse(state, f"{i}.{name}")))
        group = install_hooks(targets + [(model, _Controller(state))], "fastdiff.blockcache", fp.context)
        group.info.update(state=state)
        return group


def fitted_threshold(path: str, model) -> float:
    """The threshold in the first-block fit file ``path`` (``fastdiff fit-first-block``), checked against ``model``."""
    threshold = read_fit(path, model, "first-block").get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < float("inf"):
        raise AcceleratorError(f"blockcache: fit file {path!r} has no finite 'threshold' >= 0")
    return float(threshold)
