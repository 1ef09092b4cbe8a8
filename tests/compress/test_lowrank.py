"""lowrank: SVD splits of Linear / 1x1 / k x k conv layers, rank choice, MAC accounting, restore."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import call, make_fp
from torch import nn

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.lowrank import (
    LowRankSplit,
    choose_rank,
    factored_ranks,
    factorize,
    merge_factors,
    singular_values,
    split_macs,
    thin_svd,
)
from fastdiff.zoo.tiny import make_pipeline


@pytest.mark.parametrize(
    "layer, x",
    [
        (nn.Linear(12, 10), torch.randn(3, 12)),
        (nn.Conv2d(6, 8, 1), torch.randn(2, 6, 5, 5)),
        (nn.Conv2d(6, 8, 3, stride=2, padding=1), torch.randn(2, 6, 9, 9)),
    ],
)
def test_full_rank_split_is_the_same_layer_and_truncation_is_the_svd(layer, x):
    torch.manual_seed(0)
    w = layer.weight.detach().reshape(layer.weight.shape[0], -1)
    full = min(w.shape)
    split = factorize(layer, full)
    assert isinstance(split, LowRankSplit)
    torch.testing.assert_close(split(x), layer(x), atol=1e-5, rtol=1e-4)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    r = 2
    split_r = factorize(layer, r)
    product = split_r[1].weight.reshape(w.shape[0], r) @ split_r[0].weight.reshape(r, -1)
    torch.testing.assert_close(product, (u[:, :r] * s[:r]) @ vh[:r], atol=1e-5, rtol=1e-4)
    assert sum(p.numel() for p in split_r.parameters()) < sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("shape", [(5, 40), (40, 5)])
def test_thin_svd_of_wide_and_tall_matrices(shape):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    u, s, vh = thin_svd(w)  # a wide matrix goes through its transpose
    assert u.shape == (shape[0], 5) and vh.shape == (5, shape[1])
    torch.testing.assert_close((u * s) @ vh, w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(u.T @ u, torch.eye(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(singular_values(w), torch.linalg.svdvals(w), atol=1e-5, rtol=1e-5)


def test_rank_choice_and_mac_rule():
    s = torch.tensor([3.0, 2.0, 1.0, 0.0])  # energies 9, 4, 1: 9/14 = 0.64, 13/14 = 0.93
    assert choose_rank(s, 0.6, None) == 1
    assert choose_rank(s, 0.9, None) == 2
    assert choose_rank(s, 1.0, None) == 3
    assert choose_rank(s, 0.5, 7) == 4  # a fixed rank is capped at the full rank
    assert split_macs(nn.Linear(10, 10), 4) == (100, 80)
    assert split_macs(nn.Conv2d(4, 8, 3), 3) == (4 * 8 * 9, 3 * (4 * 9 + 8))


def test_lowrank_on_sd_reports_savings_and_restores():
    fp = make_fp("tiny-sd")
    before = call(fp, steps=2)
    handle = fp.accelerate("lowrank(rank=4,targets=linear+conv1x1)")
    info = handle.handles[0]
    assert info.layers == len(info.ranks) > 10 and set(info.ranks.values()) == {4}
    assert info.macs_after < info.macs_before and info.params_after < info.params_before
    splits = factored_ranks(fp.denoiser)
    assert splits == info.ranks
    for name in splits:  # only layers whose split costs fewer MACs
        seq = fp.denoiser.get_submodule(name)
        assert not (isinstance(seq[0], nn.Conv2d) and seq[0].kernel_size != (1, 1))
    out = call(fp, steps=2)
    assert np.isfinite(out).all() and not np.array_equal(out, before)
    handle.remove()
    assert factored_ranks(fp.denoiser) == {}
    np.testing.assert_array_equal(call(fp, steps=2), before)


def test_full_energy_leaves_every_layer_alone():
    fp = FastPipeline(make_pipeline("tiny-ddpm", "test"))
    handle = fp.accelerate("lowrank(energy=1.0,targets=all)")
    info = handle.handles[0]
    assert info.layers == 0 and info.macs_after == info.macs_before
    handle.remove()


def test_merged_factors_resplit_from_ranks_file(tmp_path):
    fp = make_fp("tiny-sd")
    handle = fp.accelerate("lowrank(energy=0.8,targets=all)")
    ranks = handle.handles[0].ranks
    split_out = call(fp, steps=2)
    assert merge_factors(fp.denoiser) == len(ranks) and factored_ranks(fp.denoiser) == {}
    np.testing.assert_allclose(call(fp, steps=2), split_out, atol=1e-4)  # dense product: same function
    path = tmp_path / "ranks.json"
    path.write_text(json.dumps(ranks))
    fp2 = FastPipeline(fp.unwrap())
    again = fp2.accelerate(f"lowrank(ranks_file={path})").handles[0]
    assert again.ranks == ranks
    np.testing.assert_allclose(call(fp2, steps=2), split_out, atol=1e-4)
    with pytest.raises(AcceleratorError, match="ranks_file 'nope.json' not found"):
        FastPipeline(fp2.unwrap()).accelerate("lowrank(ranks_file=nope.json)")


def test_bad_options():
    fp = FastPipeline(make_pipeline("tiny-ddpm", "test"))
    with pytest.raises(AcceleratorError, match=r"energy must be a number in \(0, 1\], got 1.5"):
        fp.accelerate("lowrank(energy=1.5)")
    with pytest.raises(AcceleratorError, match="rank must be an integer >= 1 or none, got 0"):
        fp.accelerate("lowrank(rank=0)")
    with pytest.raises(AcceleratorError, match="choose one of linear, conv1x1, conv3x3"):
        fp.accelerate("lowrank(targets=attention)")


def test_factors_beyond_free_memory_are_refused_before_the_model_changes(monkeypatch):
    import fastdiff.compress.lowrank as lowrank

    fp = make_fp("tiny-sd")
    before = call(fp, steps=2)
    layers = dict(fp.denoiser.named_modules())
    monkeypatch.setattr(lowrank, "free_bytes", lambda: 4096)  # as if the machine were nearly full
    with pytest.raises(AcceleratorError, match=r"already need 0\.0 GiB .* and 0\.0 GiB is free; pass a lower"):
        fp.accelerate("lowrank(rank=4)")
    assert fp.accelerators == () and dict(fp.denoiser.named_modules()) == layers
    np.testing.assert_array_equal(call(fp, steps=2), before)
    monkeypatch.undo()
    fp.accelerate("lowrank(rank=4)").remove()  # with the real free memory it applies


def test_macs_are_counted_on_fake_tensors_as_on_a_real_call():
    from torch.utils.flop_counter import FlopCounterMode

    from fastdiff.compress.common import count_params_macs
    from fastdiff.train.inputs import capture_inputs

    fp = make_fp("tiny-wan")
    inputs = capture_inputs(fp, batch=2)
    with torch.no_grad(), FlopCounterMode(display=False) as real:
        type(fp.denoiser).forward(fp.denoiser, **inputs)
    assert count_params_macs(fp.denoiser, inputs)[1] == real.get_total_flops() // 2 > 0
    out = type(fp.denoiser).forward(fp.denoiser, **inputs)[0]  # no fake tensor left behind in the model
    assert type(out) is torch.Tensor and torch.isfinite(out).all()


def test_sdxl_runs_with_its_add_embedding_split():
    # StableDiffusionXLPipeline reads unet.add_embedding.linear_1.in_features: a split layer reports its sizes
    fp = make_fp("tiny-sdxl")
    before = call(fp, steps=2)
    handle = fp.accelerate("lowrank(rank=2)")
    split = fp.denoiser.add_embedding.linear_1
    assert isinstance(split, LowRankSplit) and split.in_features == split[0].in_features
    assert np.isfinite(call(fp, steps=2)).all()
    handle.remove()
    np.testing.assert_array_equal(call(fp, steps=2), before)
