"""Token merging: same values as tomesd, removable, reproducible, every supported denoiser, loud refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers import call, make_fp, psnr

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.tome import MergePlan
from fastdiff.core.models import UnsupportedModelError


@pytest.mark.parametrize("h, w, r", [(16, 16, 128), (15, 9, 40), (8, 8, 1)])
def test_merge_plan_matches_tomesd_and_unmerges_by_copy(h, w, r):
    merge_mod = pytest.importorskip("tomesd.merge")
    torch.manual_seed(0)
    metric, x = torch.randn(2, h * w, 8), torch.randn(2, h * w, 5)
    plan = MergePlan(metric, h, w, 2, 2, r, torch.Generator().manual_seed(3))
    m, u = merge_mod.bipartite_soft_matching_random2d(
        metric, w, h, 2, 2, r, generator=torch.Generator().manual_seed(3)
    )
    merged = plan.merge(x)
    assert merged.shape == (2, h * w - plan.r, 5)
    torch.testing.assert_close(merged, m(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(plan.unmerge(merged), u(m(x)), rtol=0, atol=0)
    # Every token reads one merged row: unmerge copies, so each original token's row is in merged.
    back = plan.unmerge(merged)
    assert all(any(torch.equal(back[0, i], row) for row in merged[0]) for i in range(0, h * w, 7))


def test_same_images_as_tomesd_package():
    tomesd = pytest.importorskip("tomesd")
    theirs_fp = make_fp("tiny-sd")
    tomesd.apply_patch(theirs_fp.pipe, ratio=0.5)
    theirs_fp.unet._tome_info["args"]["generator"] = torch.Generator().manual_seed(0)  # our per-call seed
    theirs = call(theirs_fp)
    ours_fp = make_fp("tiny-sd")
    ours_fp.accelerate("tome(ratio=0.5)")
    np.testing.assert_allclose(call(ours_fp), theirs, rtol=0, atol=1e-6)


def test_remove_is_bit_identical_apply_twice_once_and_calls_reproducible():
    fp = make_fp("tiny-sd")
    before = call(fp)
    handle = fp.accelerate("tome(ratio=0.5)")
    merged = call(fp)
    assert not np.array_equal(merged, before)
    assert psnr(merged, before, float64=True) > 30
    fp.accelerate("tome(ratio=0.5)")
    assert len(fp.accelerators) == 1
    np.testing.assert_array_equal(call(fp), merged)  # the dst choice is reseeded at every call
    handle.remove()
    np.testing.assert_array_equal(call(fp), before)
    assert not any(
        getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in fp.unet.modules() if m is not fp.unet
    )


def test_sampling_randomness_untouched():
    fp = make_fp("tiny-sd")
    torch.manual_seed(7)
    call(fp, seed=None)  # the pipeline draws its noise from the global generator
    plain_state = torch.get_rng_state()
    fp.accelerate("tome(ratio=0.5)")
    torch.manual_seed(7)
    call(fp, seed=None)
    assert torch.equal(torch.get_rng_state(), plain_state)


def test_more_merging_costs_more_fidelity():
    fp = make_fp("tiny-sd")
    before = call(fp)
    scores = []
    for spec in ("tome(ratio=0.25)", "tome(ratio=0.5)", "tome(ratio=0.5,merge_cross=true,merge_mlp=true)"):
        handle = fp.accelerate(spec)
        scores.append(psnr(call(fp), before, float64=True))
        handle.remove()
    assert scores[0] > scores[1] > scores[2], scores


def test_dit_merges_its_token_grid():
    fp = make_fp("tiny-dit")
    before = call(fp)
    fp.accelerate("tome(ratio=0.5,use_rand=false)")
    after = call(fp)
    assert not np.array_equal(before, after) and np.isfinite(after).all()
    fp.remove_all()
    np.testing.assert_array_equal(call(fp), before)


def test_unet2d_residual_attention_equals_merge_after_norm():
    fp = make_fp("tiny-ddpm")  # UNet2DModel: attention (group norm + residual inside) at downsample 2
    with pytest.raises(AcceleratorError, match=r"only at downsample 2; raise max_downsample"):
        fp.accelerate("tome")
    attn = next(m for m in fp.unet.modules() if type(m).__name__ == "Attention")
    reference = copy.deepcopy(attn)
    fp.accelerate("tome(ratio=0.5,max_downsample=2)")
    x = torch.randn(2, attn.group_norm.num_channels, 8, 8)
    fp.context.call_index += 1
    fp.context.active = True  # driving the layer by hand, as fp(...) would
    with torch.no_grad():
        out = attn(x)
        # Expected: tokens + unmerge(attention without residual of merge(group_norm(tokens))).
        tokens = x.flatten(2).transpose(1, 2)
        gen = torch.Generator().manual_seed(0)
        plan = MergePlan(tokens, 8, 8, 2, 2, 32, gen)
        normed = reference.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
        reference.group_norm, reference.residual_connection = None, False
        expected = tokens + plan.unmerge(reference(plan.merge(normed)))
    torch.testing.assert_close(out, expected.transpose(1, 2).reshape(x.shape), rtol=1e-5, atol=1e-5)
    before = fp.unwrap()
    assert before is fp.pipe


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tome(ratio=0.8)", r"ratio must be in \(0, 0.75\]"),
        ("tome(ratio=0)", r"ratio must be in"),
        ("tome(max_downsample=3)", "max_downsample must be one of 1, 2, 4, 8"),
        ("tome(sx=1,sy=1)", "sx\\*sy >= 2"),
    ],
)
def test_bad_options(spec, message):
    fp = make_fp("tiny-sd")
    with pytest.raises(AcceleratorError, match=message):
        fp.accelerate(spec)
    assert fp.accelerators == ()


def test_plain_attention_refuses_cross_and_mlp_merging_and_unknown_models_fail():
    fp = make_fp("tiny-ddpm")
    with pytest.raises(AcceleratorError, match="merge_cross/merge_mlp need transformer blocks"):
        fp.accelerate("tome(max_downsample=2,merge_mlp=true)")
    assert not any(
        getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in fp.unet.modules() if m is not fp.unet
    )
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    gmm = FastPipeline(GMMPipeline(unet=GMMDenoiser(mixture_seed=0), scheduler=default_scheduler()))
    with pytest.raises(UnsupportedModelError, match="tome does not support GMMDenoiser"):
        gmm.accelerate("tome")
