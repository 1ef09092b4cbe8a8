"""deepcache: exact reuse, fidelity, removal, per-branch state, the package as reference, bad input."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from helpers import Counter, SplitBranches, call, call_kwargs, make_fp, psnr

from fastdiff import AcceleratorError, FastPipeline, UnsupportedModelError
from fastdiff.cache.deepcache import full_steps, plan, quad_center_steps
from fastdiff.core.hooks import install_hook
from fastdiff.zoo.tiny import make_pipeline

UNETS = ["tiny-sd", "tiny-sdxl", "tiny-ddpm"]
SCHEDULER = "scheduler(name=dpm++2m,steps=8)"
MIN_PSNR = 30.0  # dB vs the uncached output, 8 dpm++ steps, interval 3 (measured: 37.6-41.3 dB)

run = functools.partial(call, steps=None)  # the scheduler preset's 8 steps


def deep_leaf(unet):
    block = unet.mid_block if unet.mid_block is not None else unet.down_blocks[-1]
    return block.resnets[0].conv1


@pytest.fixture(scope="module")
def sd():
    return make_fp("tiny-sd", SCHEDULER)


@pytest.mark.parametrize("name", UNETS)
def test_cached_step_equals_full_pass_for_every_branch(name):
    # Same input twice: step 0 runs fully, step 1 reuses; the shallow part recomputes the same values, so
    # the output must be bit-identical while the deep blocks run only once.
    fp = FastPipeline(make_pipeline(name, "test"))
    unet, ctx = fp.denoiser, fp.context
    fp.pipe.scheduler.set_timesteps(4)
    sample = torch.randn(2, unet.config.in_channels, unet.config.sample_size, unet.config.sample_size)
    extra = {}
    if name != "tiny-ddpm":
        extra["encoder_hidden_states"] = torch.randn(2, 7, unet.config.cross_attention_dim)
    if name == "tiny-sdxl":
        width = unet.add_embedding.linear_1.in_features - 6 * unet.config.addition_time_embed_dim
        extra["added_cond_kwargs"] = {"text_embeds": torch.randn(2, width), "time_ids": torch.randn(2, 6)}
    for branch in range(plan(unet, 0).num_branches):
        handle = fp.accelerate(f"deepcache(interval=2,branch={branch})")
        counter = Counter(deep_leaf(unet))
        ctx.begin_call(cfg=False, cfg_layout=())
        ctx.active = True  # driving the model by hand, as fp(...) would
        outputs = []
        for step in (0, 1):
            ctx.step = step
            with torch.no_grad():
                outputs.append(unet(sample, 500, **extra).sample)
        counter.handle.remove()
        handle.remove()
        assert counter.calls == 1, (branch, counter.calls)
        torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0, msg=f"branch {branch}")


@pytest.mark.parametrize("name", ["tiny-sd", "tiny-sdxl"])
def test_close_to_baseline_and_removed_bit_identical(name):
    fp = make_fp(name, SCHEDULER)
    base = run(fp)
    counter = Counter(deep_leaf(fp.denoiser))
    handle = fp.accelerate("deepcache(interval=3,branch=0)")
    cached = run(fp)
    assert counter.calls == 3  # full passes at steps 0, 3, 6 of 8
    assert psnr(cached, base) >= MIN_PSNR and not np.array_equal(cached, base)
    handle.remove()
    counter.handle.remove()
    np.testing.assert_array_equal(run(fp), base)


def test_interval_one_is_bit_identical_on_unet2d():
    fp = make_fp("tiny-ddpm", SCHEDULER)
    base = run(fp)
    handle = fp.accelerate("deepcache(interval=1,branch=2)")
    np.testing.assert_array_equal(run(fp), base)
    handle.remove()


def test_apply_twice_is_once_and_a_second_config_conflicts(sd):
    handle = sd.accelerate("deepcache(interval=3)")
    once = run(sd)
    again = sd.accelerate("deepcache(interval=3)")
    assert len(sd.accelerators) == 2  # the scheduler and one deepcache
    np.testing.assert_array_equal(run(sd), once)
    with pytest.raises(AcceleratorError, match="deepcache.*conflicts with deepcache.*denoiser.blocks"):
        sd.accelerate("deepcache(interval=2)")
    again.remove()
    handle.remove()


def test_no_state_carried_between_calls(sd):
    handle = sd.accelerate("deepcache(interval=3)")
    run(sd, prompts=("a red fox",))
    second = run(sd, prompts=("a blue car", "a green tree"))
    handle.remove()
    fresh = make_fp("tiny-sd", SCHEDULER)
    fresh.accelerate("deepcache(interval=3)")
    np.testing.assert_array_equal(second, run(fresh, prompts=("a blue car", "a green tree")))


@pytest.mark.parametrize("guidance", [7.5, 1.0])
def test_cfg_on_and_off_with_batch(sd, guidance):
    kwargs = dict(guidance=guidance, prompts=("a red fox", "a blue car", "a cat"))
    base = run(sd, **kwargs)
    handle = sd.accelerate("deepcache(interval=2,branch=1)")
    cached = run(sd, **kwargs)
    handle.remove()
    assert cached.shape == base.shape == (3, 32, 32, 3)
    assert sd.context.branches == (("uncond", "cond") if guidance > 1 else ("cond",))
    for i in range(3):
        assert psnr(cached[i], base[i]) >= MIN_PSNR, i


def test_cached_features_follow_the_branch_when_the_batch_changes(sd):
    kwargs = dict(guidance=7.5)
    handle = sd.accelerate("deepcache(interval=3)")
    batched = run(sd, **kwargs)
    split = install_hook(sd.denoiser, SplitBranches(sd.context), "test.split")
    counter = Counter(deep_leaf(sd.denoiser))
    per_branch = run(sd, **kwargs)
    assert counter.calls == 1 + 2 + 1  # step 0 batched, step 3 split (one pass per branch), step 6 batched
    handle.remove()
    uncached = run(sd, **kwargs)
    split.remove()
    counter.handle.remove()
    np.testing.assert_allclose(per_branch, batched, atol=1e-4)
    assert psnr(uncached, per_branch) < 80  # the split run really cached


def test_matches_the_deepcache_package(sd):
    helper_cls = pytest.importorskip("DeepCache").DeepCacheSDHelper
    kwargs = dict(guidance=7.5)
    helper = helper_cls(pipe=sd.pipe)
    helper.set_params(cache_interval=3, cache_branch_id=0)
    helper.enable()
    try:  # the package acts on direct calls; through fp the next call would be refused (forward replaced)
        reference = sd.pipe(**call_kwargs(sd.pipe, steps=8, **kwargs)).images
    finally:
        helper.disable()
    handle = sd.accelerate("deepcache(interval=3,branch=0)")
    ours = run(sd, **kwargs)
    handle.remove()
    np.testing.assert_array_equal(ours, reference)


def test_schedules():
    assert full_steps(20, 3, "uniform", 0) == frozenset(range(0, 20, 3))
    assert full_steps(20, 3, "uniform", 5) == frozenset(range(0, 20, 3)) | set(range(5))
    assert full_steps(5, 1, "nonuniform", 0) == frozenset(range(5))
    for steps, interval in [(20, 3), (25, 2), (50, 5), (10, 3)]:
        chosen = sorted(full_steps(steps, interval, "nonuniform", 0))
        assert chosen[0] == 0 and chosen[-1] < steps
        assert len(chosen) == math.ceil(steps / interval)
        gaps = np.diff(chosen)
        assert gaps.max() > gaps.min()  # not uniform: wider gaps away from the centre
    try:
        from DeepCache.sd.pipeline_stable_diffusion import sample_from_quad_center
    except Exception:  # the package's pipeline module needs an older diffusers
        return
    for steps, count, center in [(50, 10, 15), (20, 7, 6), (25, 13, 8)]:
        assert quad_center_steps(steps, count, center) == list(sample_from_quad_center(steps, count, center, 1.4)[0])


def test_bad_options_and_unsupported_models(sd):
    for spec, message in [
        ("deepcache(interval=0)", "interval must be an integer >= 1, got 0"),
        ("deepcache(branch=-1)", "branch must be an integer >= 0, got -1"),
        ("deepcache(warmup=-2)", "warmup must be an integer >= 0, got -2"),
        ("deepcache(schedule=random)", "choose one of uniform, nonuniform"),
    ]:
        with pytest.raises(AcceleratorError, match=message):
            sd.accelerate(spec)
    with pytest.raises(AcceleratorError, match=r"branch=4 is out of range.*0\.\.3"):
        sd.accelerate("deepcache(branch=4)")
    assert [str(c) for c in sd.accelerators] == ["scheduler(name=dpm++2m,steps=8)"]
    dit = FastPipeline(make_pipeline("tiny-dit", "test"))
    with pytest.raises(UnsupportedModelError, match="deepcache needs a UNet.*DiTTransformer2DModel.*blockcache"):
        dit.accelerate("deepcache(interval=3)")
    assert dit.accelerators == ()
    with pytest.raises(UnsupportedModelError, match="blockcache needs a transformer.*UNet2DConditionModel"):
        sd.accelerate("blockcache")


def test_a_copy_of_a_wrapped_unet_is_cleaned_and_accelerates():
    # A deep copy of a wrapped UNet carries the wrapper's hooks with a copied (never active) context; wrapped
    # again, those stale hooks used to leave deepcache doing nothing (images identical to plain, no speedup).
    import copy

    from fastdiff.core.siblings import sibling

    fp = make_fp("tiny-sd", SCHEDULER)
    plain = run(fp)
    cached_fresh = make_fp("tiny-sd", SCHEDULER)
    cached_fresh.accelerate("deepcache(interval=3)")
    expected = run(cached_fresh)
    twin = sibling(fp.pipe, unet=copy.deepcopy(fp.denoiser))
    with pytest.warns(UserWarning, match="copied with it from a wrapped model"):
        copied = FastPipeline(twin)
    assert all(not n.endswith("@" + str(fp.context.owner)) for n in copied.denoiser._diffusers_hook.hooks)
    copied.accelerate(SCHEDULER)
    copied.accelerate("deepcache(interval=3)")
    images = run(copied)
    assert not np.array_equal(images, plain)
    np.testing.assert_array_equal(images, expected)
    copied.unwrap()
    assert getattr(twin.unet, "_diffusers_hook", None) is None  # the copy is left plain
    np.testing.assert_array_equal(run(fp), plain)  # the original wrapper is untouched
