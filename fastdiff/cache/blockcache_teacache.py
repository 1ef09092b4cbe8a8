"""blockcache(mode=teacache): TeaCache-style block skipping (this module registers no accelerator of its own).

Decide from the first block's timestep-modulated input whether to run the blocks.

Liu et al. 2024 ("Timestep Embedding Tells: It's Time to Cache for Video Diffusion Model"): the relative L1
change of the first block's adaLN-modulated input between steps tracks the change of the blocks' output, once
rescaled by a polynomial fitted per model. Each step adds the rescaled change to an accumulator; while it stays
below ``threshold`` every block is skipped and the blocks' residual (output minus input) of the last computed
step is added instead; when it reaches the threshold the blocks run and the accumulator restarts. The first
and last steps of a call always run. State is kept per guidance branch and cleared at every call.

The modulated input is computed by the first block's own adaLN layer (``MODULATION`` facts), as in the reference
implementation; where that layer returns it (adaLN norms: Flux, SD3, HunyuanVideo), a hook on the layer hands the
output to the block when it runs, so a computed step calls the layer once, not twice. ``fit_rescaling`` fits the
polynomial for a model from full calls (``fastdiff fit-teacache``); without a fit the change is used as it is.

Example::

    fp.accelerate("blockcache(mode=teacache,threshold=0.3)")   # on a Flux or SD3 pipeline
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from diffusers.hooks import ModelHook

from fastdiff.cache.blockio import hidden_in, passed_through, with_hidden
from fastdiff.core.denoisers import MODULATION
from fastdiff.core.diffusers_compat import StatefulHook, block_argument
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.registry import AcceleratorError


def modulation_of(block) -> tuple[str, ...]:
    """``block``'s ``MODULATION`` facts, or a refusal naming the block class."""
    found = MODULATION.get(type(block).__name__)
    # a shared block class (BasicTransformerBlock) modulates through its table only in some models (PixArt)
    if found is None or not all(
        hasattr(block, name) for name in (found[0], *found[2:]) if not name.startswith("chunks:")
    ):
        raise UnsupportedModelError(
            f"blockcache(mode=teacache) has no facts on where {type(block).__name__} modulates its input "
            f"(known: {', '.join(sorted(MODULATION))}, BasicTransformerBlock with an adaLN-single table only); "
            "use mode=first-block"
        )
    return found


def modulated_input(
    block, io, args, kwargs, facts: tuple[str, ...] | None = None, hidden: torch.Tensor | None = None
) -> torch.Tensor:
    """The first block's adaLN-modulated input; ``facts``: its ``modulation_of`` (looked up when not given);
    ``hidden``: its image states, if already read."""
    norm_name, emb_name, *table = facts or modulation_of(block)
    emb = block_argument(io, emb_name, args, kwargs)
    hidden = hidden_in(io, args, kwargs) if hidden is None else hidden
    if not table:
        return getattr(block, norm_name)(hidden, emb=emb)[0]
    if table[0].startswith("chunks:"):  # shift, scale, gate, ... as equal chunks of the last dim
        mod = emb if emb.ndim == 3 else emb.unsqueeze(1)
        shift, scale = mod.chunk(int(table[0].split(":")[1]), dim=-1)[:2]
        return getattr(block, norm_name)(hidden) * (1 + scale) + shift
    rows = getattr(block, table[0])
    dim = rows.shape[-1]
    # (batch, 1 or tokens, 6, dim): one row set per sample (PixArt, Sana, Wan) or per token (LTX)
    ada = rows.reshape(6, dim) + emb.reshape(emb.shape[0], -1, 6, dim)
    shift, scale = ada[:, :, 0], ada[:, :, 1]
    return getattr(block, norm_name)(hidden) * (1 + scale) + shift


def l1_norm(t: torch.Tensor) -> torch.Tensor:
    """Sum of |t| in one reduction (no temporary |t|: host time on every step), in float32 so that a half-precision
    sum cannot overflow."""
    return torch.linalg.vector_norm(t, 1, dtype=torch.float32)


def relative_change(now: torch.Tensor, before: torch.Tensor) -> float:
    """Mean |now - before| over mean |before|, as a ratio of L1 norms (the element counts cancel)."""
    return (l1_norm(now - before) / l1_norm(before)).item()  # one host read


FIT_COMMANDS = {"teacache": "fastdiff fit-teacache", "first-block": "fastdiff fit-first-block"}


def read_fit(path: str, model, mode: str) -> dict:
    """The fit file ``path`` of ``blockcache(mode=MODE,fit=PATH)``, checked: it exists, is a JSON object, and was
    made for ``mode`` (a file without ``mode`` is a TeaCache fit, as files written before it) on ``model``'s class.
    Each refusal is an AcceleratorError naming the file and the command that writes a right one."""
    make = f"make one: {FIT_COMMANDS[mode]}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise AcceleratorError(f"blockcache: fit file {path!r} does not exist ({make})")
    try:
        fit = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AcceleratorError(f"blockcache: fit file {path!r} is not JSON ({error}; {make})") from None
    if not isinstance(fit, dict):
        raise AcceleratorError(f"blockcache: fit file {path!r} is not a JSON object ({make})")
    made_for = fit.get("mode", "teacache")
    if made_for != mode:
        raise AcceleratorError(f"blockcache: {path} was made for mode={made_for}, not mode={mode} ({make})")
    if fit.get("model") != type(model).__name__:
        raise UnsupportedModelError(
            f"blockcache: {path} was fitted on {fit.get('model')}, not on {type(model).__name__}"
        )
    return fit


def load_rescaling(path: str | None, model) -> np.poly1d:
    """The fitted polynomial in ``path`` (written by ``fit_rescaling``), checked against ``model``; else x."""
    if path is None:
        return np.poly1d([1.0, 0.0])
    coefficients = read_fit(path, model, "teacache").get("coefficients")
    if not (
        isinstance(coefficients, list)
        and coefficients
        and all(isinstance(c, (int, float)) and np.isfinite(c) for c in coefficients)
    ):
        raise AcceleratorError(f"blockcache: fit file {path!r} has no list of finite 'coefficients'")
    return np.poly1d(coefficients)


class ReuseModulation(StatefulHook):
    """On the first block's adaLN layer: the block's own call with the inputs ``TeaHead`` just modulated returns
    the output ``TeaHead`` kept (the same call on the same tensors) instead of computing it again."""

    def __init__(self):
        super().__init__()
        self.kept: tuple[torch.Tensor, torch.Tensor, object] | None = None  # (hidden, emb, output), used once

    def reset_state(self, module):
        self.kept = None
        return module

    def new_forward(self, module, *args, **kwargs):
        kept, self.kept = self.kept, None
        same_call = kept is not None and len(args) == 1 and kwargs.keys() == {"emb"}
        if same_call and args[0] is kept[0] and kwargs["emb"] is kept[1]:  # the very tensors TeaHead passed
            return kept[2]
        return self.fn_ref.original_forward(*args, **kwargs)


class TeaHead(ModelHook):
    """On block 0: accumulates the rescaled change of the modulated input; skips every block below threshold.

    ``reuse``: the ``ReuseModulation`` hook on the block's adaLN layer, where that layer returns the modulated
    input (no table facts); None otherwise."""

    def __init__(self, state, io, rescale: np.poly1d, facts: tuple[str, ...], reuse: ReuseModulation | None = None):
        super().__init__()
        self.state, self.io, self.facts, self.reuse = state, io, facts, reuse
        self.coefficients = [float(c) for c in rescale.coeffs]  # evaluated as np.polyval does, without numpy

    def rescaled(self, change: float) -> float:
        total = 0.0
        for c in self.coefficients:  # Horner's rule, as np.polyval (same float64 operations, same result)
            total = total * change + c
        return total

    def new_forward(self, module, *args, **kwargs):
        st, ctx, io = self.state, self.state.context, self.io
        # per-branch state, cleared every call by blockcache's controller
        branches, saved = st.branches, st.saved
        hidden = hidden_in(io, args, kwargs)
        if self.reuse is None:
            modulated = modulated_input(module, io, args, kwargs, self.facts, hidden)
        else:  # the layer's call as the block makes it, through the reuse hook; the block gets its output
            emb = block_argument(io, self.facts[1], args, kwargs)
            output = getattr(module, self.facts[0])(hidden, emb=emb)
            self.reuse.kept, modulated = (hidden, emb, output), output[0]
        edge = ctx.step == 0 or ctx.step >= ctx.num_steps - 1
        inputs, tail = saved.store("modulated"), saved.store("tail")
        st.skip = False
        chunk = modulated.shape[0] // len(branches)
        if not edge and inputs.has(branches, chunk=chunk) and tail.has(branches):
            so_far = max(saved.value("accumulated", b, 0.0) for b in branches)
            total = so_far + self.rescaled(relative_change(modulated, inputs.get(branches)))
            st.skip = total < st.threshold
            st.skipped += st.skip
            saved.set("accumulated", branches, total if st.skip else 0.0)
        else:
            saved.set("accumulated", branches, 0.0)
        inputs.put(branches, ctx.step, modulated)
        if st.skip:
            if self.reuse is not None:
                self.reuse.kept = None
            return with_hidden(io, passed_through(io, args, kwargs, hidden), hidden + st.tail_residual(branches))
        st.head_output = hidden  # the last block stores its output beside this: the residual of all blocks
        return self.fn_ref.original_forward(*args, **kwargs)


def fit_rescaling(fp, calls: list[dict], degree: int = 4) -> dict:
    """Fit the output-change polynomial of TeaCache on full calls of ``fp`` (a FastPipeline) with ``calls``' kwargs.

    Records, per step after the first, the relative change of the first block's modulated input and of the
    blocks' residual, and fits ``np.polyfit`` of the second on the first. Returns the JSON-ready fit.
    """
    from fastdiff.cache.blockio import first_and_last_blocks
    from fastdiff.core.denoisers import block_io
    from fastdiff.core.hooks import install_hook

    first, last = first_and_last_blocks(fp.denoiser)
    io_first, io_last = block_io(first), block_io(last)
    pairs: list[tuple[float, float]] = []
    seen: dict = {}

    class Record(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen["mod"] = modulated_input(module, io_first, args, kwargs)
            seen["in"] = hidden_in(io_first, args, kwargs)
            return args, kwargs

    class RecordLast(ModelHook):
        def post_forward(self, module, output):
            from fastdiff.cache.blockio import hidden_out

            key = (fp.context.call_index, fp.context.branches)
            residual = hidden_out(io_last, output) - seen["in"]
            before = seen.get(key)
            if before is not None:
                pairs.append((relative_change(seen["mod"], before[0]), relative_change(residual, before[1])))
            seen[key] = (seen["mod"], residual)
            return output

    handles = [
        install_hook(first, Record(), "fastdiff.teacache-fit", fp.context),
        install_hook(last, RecordLast(), "fastdiff.teacache-fit", fp.context),
    ]
    try:
        for kwargs in calls:
            fp(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    x, y = np.array(pairs).T
    coefficients = np.polyfit(x, y, degree)
    residual = float(np.sqrt(np.mean((np.polyval(coefficients, x) - y) ** 2)))
    return {
        "mode": "teacache",
        "model": type(fp.denoiser).__name__,
        "coefficients": coefficients.tolist(),
        "points": len(pairs),
        "rms_error": residual,
    }
