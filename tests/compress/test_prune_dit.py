"""prune on transformer denoisers (tiny DiT): heads and MLP widths, remove, save and load_compressed."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from helpers import call, make_fp, psnr

from fastdiff.compress.prune import check_prunable
from fastdiff.compress.prune_dit import STRUCTURE, structure
from fastdiff.compress.recover import MANIFEST, compress_model, load_compressed
from fastdiff.core.models import UnsupportedModelError
from fastdiff.zoo import build

images = functools.partial(call, steps=2)


def removed_params(den) -> int:
    """Parameters ratio=0.5 removes from the tiny DiT: half the heads and half the MLP channels per block."""
    total = 0
    for block in den.transformer_blocks:
        a, proj, out = block.attn1, block.ff.net[0].proj, block.ff.net[2]
        q = a.to_q.weight.numel() + a.to_q.bias.numel()
        total += (3 * q + a.to_out[0].weight.numel()) // 2  # to_out's bias is the residual width: kept
        total += (proj.weight.numel() + proj.bias.numel() + out.weight.numel()) // 2
    return total


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_prune_dit_heads_and_mlp_run_everywhere_and_restore(importance):
    fp = make_fp("tiny-dit")
    den = fp.denoiser
    before = images(fp)
    expected = removed_params(den)
    handle = fp.accelerate(f"prune(ratio=0.5,importance={importance})")
    info = handle.handles[0]
    assert info.params_before - info.params_after == expected
    assert info.macs_after < 0.6 * info.macs_before
    assert info.heads == (1, 1) and info.ff_widths == (64, 64)
    for block in den.transformer_blocks:
        a = block.attn1
        assert a.heads == 1 and a.inner_dim == a.inner_kv_dim == 16 and a.to_q.out_features == 16
        assert a.to_out[0].in_features == 16 and block.ff.net[2].in_features == 64
    assert all(p.grad is None for p in den.parameters())
    pruned = images(fp)
    assert np.isfinite(pruned).all() and not np.array_equal(pruned, before)
    assert psnr(pruned, before) > 5  # random weights: only that it still makes images of the same scale
    for guidance in (1.0, 4.0):  # other batch sizes than the captured call, guidance on and off
        for labels in ((3,), (1, 2, 3)):
            out = images(fp, guidance=guidance, labels=labels)
            assert out.shape == (len(labels), 32, 32, 3) and np.isfinite(out).all()
    with torch.no_grad():  # another resolution
        sample = den(torch.randn(2, 4, 32, 32), torch.tensor([10, 900]), class_labels=torch.tensor([0, 5])).sample
    assert sample.shape == (2, 8, 32, 32)
    handle.remove()
    np.testing.assert_array_equal(images(fp), before)
    assert structure(den) == {f"transformer_blocks.{i}": {"attn1": 2, "ff": 128} for i in range(2)}


def test_prune_dit_keeps_one_head_and_ranks_by_importance():
    fp = make_fp("tiny-dit")
    a = fp.denoiser.transformer_blocks[0].attn1
    with torch.no_grad():  # make head 0 the weak one: magnitude must keep head 1
        for lin in (a.to_q, a.to_k, a.to_v):
            lin.weight[:16] *= 1e-3
        kept = a.to_q.weight[16:].clone()
    handle = fp.accelerate("prune(ratio=0.9)")
    new = fp.denoiser.transformer_blocks[0].attn1
    assert new.heads == 1 and torch.equal(new.to_q.weight, kept)
    assert handle.handles[0].ff_widths == (12, 12)  # int(128 * 0.1)
    assert np.isfinite(images(fp)).all()
    handle.remove()


def test_compress_model_round_trips_a_pruned_dit(tmp_path, monkeypatch):
    from fastdiff.compress import prune_dit

    saved_fp = {}
    write = prune_dit.write_structure

    def spy(fp, out_dir):  # called by compress_model right after saving: the in-memory recovered model
        saved_fp.update(
            state={k: v.clone() for k, v in fp.denoiser.state_dict().items()},
            images=[images(fp, guidance=g) for g in (1.0, 4.0)],
        )
        return write(fp, out_dir)

    monkeypatch.setattr(prune_dit, "write_structure", spy)
    model = build("tiny-dit", tmp_path / "tiny-dit", size="test")
    out = tmp_path / "pruned"
    report = compress_model(model, out, "prune(ratio=0.5)", recover_steps=2, batch=2, progress=False)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["load_structure"] == STRUCTURE and manifest["load_accelerators"] == ""
    saved = json.loads((out / STRUCTURE).read_text())
    assert saved["component"] == "transformer"
    assert saved["blocks"]["transformer_blocks.1"] == {"attn1": 1, "ff": 64}
    loaded = load_compressed(out)
    loaded.pipe.set_progress_bar_config(disable=True)
    params = sum(p.numel() for p in loaded.denoiser.parameters())
    assert params == report["applied"]["prune(ratio=0.5)"]["params_after"]
    state = loaded.denoiser.state_dict()
    assert state.keys() == saved_fp["state"].keys()
    assert all(torch.equal(state[k], v) for k, v in saved_fp["state"].items())
    for guidance, want in zip((1.0, 4.0), saved_fp["images"]):
        np.testing.assert_array_equal(images(loaded, guidance=guidance), want)

    # Recompressing into the same directory without pruning removes the stale structure file.
    compress_model(model, out, "sparsity(pattern=2:4)", recover_steps=0, batch=2, progress=False)
    assert not (out / STRUCTURE).exists()
    assert load_compressed(out).denoiser.transformer_blocks[0].attn1.heads == 2


def test_prune_refuses_transformers_it_cannot_prune():
    fp = make_fp("tiny-dit")
    den = fp.denoiser
    den.transformer_blocks = torch.nn.ModuleList([torch.nn.Identity()])
    with pytest.raises(UnsupportedModelError, match="DiTTransformer2DModel is a transformer of neither kind"):
        fp.accelerate("prune(ratio=0.5)")
    assert fp.accelerators == ()
    with pytest.raises(UnsupportedModelError, match="prune does not support Linear"):
        check_prunable(torch.nn.Linear(2, 2), "prune")
