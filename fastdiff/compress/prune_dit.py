"""Width pruning of transformer denoisers (DiT and other ``BasicTransformerBlock`` stacks) for ``prune``.

``prune(ratio=0.5, importance=magnitude|taylor)`` on a transformer denoiser whose ``transformer_blocks`` are
diffusers ``BasicTransformerBlock`` s (``DiTTransformer2DModel``, the transformer fastdiff's model table knows;
the functions here take any such stack, e.g. PixArt's) keeps the residual (hidden) width, the embeddings,
norms and the patch projections fixed, and in every block removes

- ``ratio`` of the feed-forward hidden channels: ``ff.net[0].proj`` outputs (both halves alike for GEGLU and
  SwiGLU) and the matching inputs of the second Linear;
- ``ratio`` of the whole heads of each attention (``attn1``, and ``attn2`` where there is one), at least one
  kept: the head's ``to_q``/``to_k``/``to_v`` output rows and ``to_out[0]`` input columns. ``heads``,
  ``inner_dim``, ``inner_kv_dim`` and ``sliceable_head_dim`` are updated; the head dimension and so the
  softmax scale stay. Attentions with grouped key/value heads, added key/value projections, fused QKV or a
  query/key norm across heads keep their heads.

Channels and heads are ranked per block by ``magnitude`` (the squared L2 norm of every weight and bias entry
of the channel or head, summed over the layers it spans) or ``taylor`` (the sum of ``|weight * grad|`` over the
same entries, gradients of the denoising loss on a few noised batches, ``common.taylor_gradients``). The
surgery is torch-pruning's ``prune_linear_out_channels`` / ``prune_linear_in_channels``. The result is a
smaller dense model that runs at every batch size, resolution and guidance setting the original did; the
handle reports ``params_before/after``, ``macs_before/after`` and the kept ``heads`` / ``ff_widths`` per block.
``remove()`` puts the original (deep-copied) children back.

Saving: diffusers' transformer configs have one head count and no feed-forward width per block, so
``from_pretrained`` cannot rebuild the pruned model (no config key expresses it). ``compress_model`` saves the
pruned weights as usual plus ``prune_structure.json`` (``write_structure``: the denoiser's component name and,
per block, its kept heads and FF width); ``load_compressed`` builds the original-shaped denoiser from the
saved config, shrinks its layers to those shapes (``apply_structure``), loads the saved weights strictly and
hands the model to ``from_pretrained`` as that component (``structured_components``).

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-dit", "test"))
    handle = fp.accelerate("prune(ratio=0.5)")
    info = handle.handles[0]
    print(info.heads, info.ff_widths, info.params_after / info.params_before)
    handle.remove()
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from fastdiff.compress.common import (
    PruningCopies,
    config_mismatch,
    count_params_macs,
    sized_handle,
    taylor_gradients,
)
from fastdiff.core.hooks import Handle
from fastdiff.train.inputs import capture_inputs

STRUCTURE = "prune_structure.json"
_PAIRED_ACTS = ("GEGLU", "SwiGLU")  # activations whose projection output is chunked in two halves


def transformer_blocks(den) -> list[tuple[str, nn.Module]]:
    """[(name, block)] of a transformer denoiser made of ``BasicTransformerBlock`` s; [] for other models."""
    from diffusers.models.attention import BasicTransformerBlock

    blocks = getattr(den, "transformer_blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks):
        return []
    if not all(isinstance(b, BasicTransformerBlock) for b in blocks):
        return []
    return [(f"transformer_blocks.{i}", b) for i, b in enumerate(blocks)]


def _ff_layers(block):
    """(projection, output Linear, chunks) of a block's feed-forward, or None if it has none this prunes."""
    ff = getattr(block, "ff", None)
    net = getattr(ff, "net", None)
    if net is None or not isinstance(getattr(net[0], "proj", None), nn.Linear):
        return None
    out = next((m for m in list(net)[1:] if isinstance(m, nn.Linear)), None)
    if out is None:
        return None
    chunks = 2 if type(net[0]).__name__ in _PAIRED_ACTS else 1
    return (net[0].proj, out, chunks) if net[0].proj.out_features == chunks * out.in_features else None


def _head_attentions(block) -> dict:
    """{"attn1"/"attn2": Attention} of a block whose heads this module can remove."""
    from diffusers.models.attention_processor import Attention

    found = {}
    for name in ("attn1", "attn2"):
        a = getattr(block, name, None)
        if not isinstance(a, Attention) or getattr(a, "fused_projections", False):
            continue
        if a.inner_dim != a.inner_kv_dim or a.to_q.out_features != a.inner_dim or a.inner_dim % a.heads:
            continue  # grouped key/value heads or an unusual layout
        if getattr(a, "add_k_proj", None) is not None or getattr(a, "to_add_out", None) is not None:
            continue
        norm = getattr(a, "norm_q", None)
        shape = getattr(norm, "normalized_shape", getattr(getattr(norm, "weight", None), "shape", None))
        if norm is not None and (shape is None or tuple(shape)[-1] != a.inner_dim // a.heads):
            continue  # a query/key norm across all heads would need pruning too
        found[name] = a
    return found


def structure(den) -> dict:
    """{block name: {"attn1": heads, "attn2": heads, "ff": width}} of the prunable parts, as they are now."""
    out = {}
    for name, block in transformer_blocks(den):
        entry = {k: a.heads for k, a in _head_attentions(block).items()}
        if (ff := _ff_layers(block)) is not None:
            entry["ff"] = ff[1].in_features
        out[name] = entry
    return out


def _score(layers_rows: list, layers_cols: list, importance: str, n_groups: int) -> torch.Tensor:
    """Importance of ``n_groups`` equal groups of output rows (``layers_rows``) and input columns.

    ``layers_rows``: [(Linear, chunks)] whose output rows split as chunks x n_groups x per-group; the bias
    follows the rows. ``layers_cols``: Linears whose input columns split as n_groups x per-group.
    """

    def entry(p):
        if importance == "taylor":
            return (p.detach() * p.grad).abs() if p.grad is not None else torch.zeros_like(p)
        return p.detach() ** 2

    score = torch.zeros(n_groups, dtype=torch.float64)
    for lin, chunks in layers_rows:
        for p in (lin.weight, lin.bias):
            if p is not None:
                score += entry(p).double().reshape(chunks, n_groups, -1).sum((0, 2))
    for lin in layers_cols:
        score += entry(lin.weight).double().reshape(lin.out_features, n_groups, -1).sum((0, 2))
    return score


def _kept(n: int, ratio: float) -> int:
    return max(1, int(n * (1 - ratio) + 1e-9))


def _remove_ff(proj, out, chunks, drop: list[int]) -> None:
    import torch_pruning as tp

    width = out.in_features
    tp.prune_linear_out_channels(proj, [c * width + i for c in range(chunks) for i in drop])
    tp.prune_linear_in_channels(out, drop)


def _remove_heads(a, drop: list[int]) -> None:
    import torch_pruning as tp

    dim = a.inner_dim // a.heads
    channels = [h * dim + i for h in drop for i in range(dim)]
    for lin in (a.to_q, a.to_k, a.to_v):
        tp.prune_linear_out_channels(lin, channels)
    tp.prune_linear_in_channels(a.to_out[0], channels)
    a.heads -= len(drop)
    a.inner_dim = a.inner_kv_dim = a.heads * dim
    a.sliceable_head_dim = a.heads


def _prune_blocks(den, ratio: float, importance: str) -> None:
    for _, block in transformer_blocks(den):
        if (ff := _ff_layers(block)) is not None:
            proj, out, chunks = ff
            width = out.in_features
            score = _score([(proj, chunks)], [out], importance, width)
            _remove_ff(proj, out, chunks, sorted(score.argsort()[: width - _kept(width, ratio)].tolist()))
        for a in _head_attentions(block).values():
            score = _score([(a.to_q, 1), (a.to_k, 1), (a.to_v, 1)], [a.to_out[0]], importance, a.heads)
            _remove_heads(a, sorted(score.argsort()[: a.heads - _kept(a.heads, ratio)].tolist()))


def prune_transformer(fp, config) -> Handle:
    """``Prune.apply`` for transformer denoisers (see the module docstring)."""
    den = fp.denoiser
    inputs = capture_inputs(fp, batch=2)
    before = count_params_macs(den, inputs)
    trainable = any(p.requires_grad for p in den.parameters())
    copies = PruningCopies(den)  # prune copies; the originals come back on remove()
    try:
        if config.importance == "taylor":
            with torch.enable_grad():
                den.requires_grad_(True)
                taylor_gradients(den, fp, inputs)
        _prune_blocks(den, config.ratio, config.importance)
    except BaseException:
        copies.restore()
        raise
    den.zero_grad(set_to_none=True)
    den.requires_grad_(trainable)  # torch-pruning's new Parameters require grad; keep the model's setting
    copies.finish()
    kept = structure(den)
    return sized_handle(
        copies.restore,
        den,
        inputs,
        before,
        heads=tuple(entry.get("attn1") for entry in kept.values()),
        ff_widths=tuple(entry.get("ff") for entry in kept.values()),
        config_exact=False,
    )


def apply_structure(den, wanted: dict) -> None:
    """Shrink an original-shaped denoiser's layers to ``wanted`` (``structure`` of a pruned one).

    Keeps the first channels and heads: the weights loaded afterwards fill them.
    """
    blocks = dict(transformer_blocks(den))
    missing = [n for n in wanted if n not in blocks]
    if missing:
        raise ValueError(f"prune structure names blocks this model lacks: {missing[:3]}")
    for name, entry in wanted.items():
        block = blocks[name]
        attns = _head_attentions(block)
        for key, heads in entry.items():
            if key == "ff":
                proj, out, chunks = _ff_layers(block)
                _remove_ff(proj, out, chunks, list(range(heads, out.in_features)))
            else:
                _remove_heads(attns[key], list(range(heads, attns[key].heads)))


def write_structure(fp, out_dir) -> str | None:
    """Write ``prune_structure.json`` if ``fp``'s transformer denoiser differs from what its config builds.

    Returns the file name, or None (and removes a stale file) when the saved config rebuilds the model.
    """
    den, path = fp.denoiser, Path(out_dir) / STRUCTURE
    path.unlink(missing_ok=True)
    if not transformer_blocks(den) or config_mismatch(den) is None:
        return None
    path.write_text(json.dumps({"component": fp.denoiser_name, "blocks": structure(den)}, indent=1))
    return STRUCTURE


def structured_components(out_dir, torch_dtype=None) -> dict:
    """{component: pruned denoiser with the saved weights} for ``from_pretrained``; {} without a structure file."""
    import diffusers
    from diffusers.utils import SAFETENSORS_WEIGHTS_NAME, WEIGHTS_NAME
    from safetensors.torch import load_file

    path = Path(out_dir) / STRUCTURE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    folder = Path(out_dir) / data["component"]
    config = json.loads((folder / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    den = cls.from_config(cls.load_config(folder))
    apply_structure(den, data["blocks"])
    files = sorted(folder.glob("*.safetensors"))
    if files:
        state = {k: v for f in files for k, v in load_file(f).items()}
    elif (folder / WEIGHTS_NAME).is_file():
        state = torch.load(folder / WEIGHTS_NAME, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"no {SAFETENSORS_WEIGHTS_NAME} or {WEIGHTS_NAME} in {folder}")
    den.load_state_dict(state, strict=True)
    den.register_to_config(_name_or_path=str(folder))
    den = den.eval()
    return {data["component"]: den.to(torch_dtype) if torch_dtype is not None else den}
