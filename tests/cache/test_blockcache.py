"""blockcache on DiT: first-block (vs diffusers' FirstBlockCache) and interval reuse, removal, branches, errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache
from diffusers.hooks.hooks import CacheContext, _set_cache_context
from helpers import Counter, SplitBranches, call, make_fp, psnr

from fastdiff import AcceleratorError, FastPipeline, UnsupportedModelError
from fastdiff.core.hooks import install_hook
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.zoo.tiny import make_pipeline

MIN_PSNR = 30.0  # dB vs the uncached output, 8 dpm++ steps (interval=2 measured ~40 dB on tiny-dit test)
SCHEDULER = "scheduler(name=dpm++2m,steps=8)"
MODES = ["blockcache(mode=first-block,threshold=0.2)", "blockcache(mode=interval,interval=2)"]


@pytest.fixture(scope="module")
def dit():
    return make_fp("tiny-dit", SCHEDULER)


run = functools.partial(call, steps=None, guidance=4.0)  # the scheduler preset's 8 steps


def last_leaf(fp):
    """A leaf module inside the last block (skipped work never reaches it)."""
    return fp.denoiser.transformer_blocks[-1].attn1.to_q


@pytest.mark.parametrize("spec", MODES)
@pytest.mark.parametrize("guidance", [4.0, 1.0])
def test_close_to_baseline_skips_work_and_removes_bit_identical(dit, spec, guidance):
    labels = (1, 2, 3)
    base = run(dit, labels=labels, guidance=guidance)
    counter = Counter(last_leaf(dit))
    handle = dit.accelerate(spec)
    cached = run(dit, labels=labels, guidance=guidance)
    handle.remove()
    counter.handle.remove()
    assert cached.shape == base.shape == (3, 32, 32, 3)
    assert 1 <= counter.calls < 8 and not np.array_equal(cached, base)
    if "interval" in spec:
        assert counter.calls == 4  # steps 0, 2, 4, 6
    for i in range(3):
        assert psnr(cached[i], base[i]) >= MIN_PSNR, i
    np.testing.assert_array_equal(run(dit, labels=labels, guidance=guidance), base)


def test_threshold_zero_never_skips(dit):
    base = run(dit)
    handle = dit.accelerate("blockcache(mode=first-block,threshold=0)")
    np.testing.assert_array_equal(run(dit), base)
    handle.remove()


def test_first_block_matches_diffusers_first_block_cache():
    for threshold in (0.1, 0.3):
        pipe = make_pipeline("tiny-dit", "test")
        pipe.set_progress_bar_config(disable=True)
        pipe.scheduler = make_scheduler("dpm++2m", pipe.scheduler.config)
        apply_first_block_cache(pipe.transformer, FirstBlockCacheConfig(threshold=threshold))
        _set_cache_context(pipe.transformer, CacheContext("batch"))  # DiTPipeline sets none itself
        kwargs = dict(class_labels=[1, 2], guidance_scale=4.0, output_type="np")
        generator = torch.Generator().manual_seed(0)
        reference = pipe(**kwargs, num_inference_steps=8, generator=generator).images
        fp = make_fp("tiny-dit", SCHEDULER)
        fp.accelerate(f"blockcache(threshold={threshold})")
        np.testing.assert_array_equal(run(fp), reference)


@pytest.mark.parametrize("threshold", [0.1, 0.2])
def test_first_block_matches_diffusers_where_it_skips_steps_on_the_trained_moving_digits(tmp_path, threshold):
    """On a trained model (random weights change their first block too much for any step to be skipped): both
    caches skip steps at these thresholds, and the frames are diffusers' own, bit for bit."""
    from fastdiff.zoo import build
    from fastdiff.zoo import moving_digits as md
    from fastdiff.zoo.reference_flow import load_flow_pipeline

    pipe = load_flow_pipeline(build("moving-digits", tmp_path / "md", size="bench"))
    pipe.set_progress_bar_config(disable=True)

    def frames(target):
        return target(
            prompt=md.bench_prompts()[:2],
            num_inference_steps=12,
            height=md.CANVAS,
            width=md.CANVAS,
            num_frames=md.FRAMES,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
        ).frames

    base = frames(pipe)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    reference = frames(pipe)
    pipe.transformer.disable_cache()
    fp = FastPipeline(pipe)
    handle = fp.accelerate(f"blockcache(mode=first-block,threshold={threshold})")
    ours = frames(fp)
    skipped = handle.handles[0].info["state"].skipped
    assert not np.array_equal(reference, base) and 0 < skipped < 2 * 12  # skips some evaluations, not all
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("spec", MODES)
def test_apply_twice_is_once_and_no_state_between_calls(dit, spec):
    handle = dit.accelerate(spec)
    again = dit.accelerate(spec)
    assert len(dit.accelerators) == 2  # the scheduler and one blockcache
    run(dit, labels=(5,))
    second = run(dit, labels=(7, 8))
    again.remove()
    handle.remove()
    fresh = make_fp("tiny-dit", SCHEDULER)
    fresh.accelerate(spec)
    np.testing.assert_array_equal(second, run(fresh, labels=(7, 8)))


def test_interval_reuse_is_exact_for_identical_inputs():
    fp = FastPipeline(make_pipeline("tiny-dit", "test"))
    model, ctx = fp.denoiser, fp.context
    fp.pipe.scheduler.set_timesteps(4)
    handle = fp.accelerate("blockcache(mode=interval,interval=4)")
    counter = Counter(last_leaf(fp))
    latents = torch.randn(2, model.config.in_channels, model.config.sample_size, model.config.sample_size)
    ctx.begin_call(cfg=False, cfg_layout=())
    ctx.active = True  # driving the model by hand, as fp(...) would
    outputs = []
    for step in (0, 1):
        ctx.step = step
        with torch.no_grad():
            outputs.append(model(latents, timestep=torch.tensor([500, 500]), class_labels=torch.tensor([1, 2])).sample)
    handle.remove()
    counter.handle.remove()
    assert counter.calls == 1
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["blockcache(mode=first-block,threshold=1000)", MODES[1]])
def test_state_follows_the_branch_when_the_batch_changes(dit, spec):
    handle = dit.accelerate(spec)
    batched = run(dit)
    split = install_hook(dit.denoiser, SplitBranches(dit.context), "test.split")
    counter = Counter(last_leaf(dit))
    per_branch = run(dit)
    handle.remove()
    uncached = run(dit)
    split.remove()
    counter.handle.remove()
    # 8 steps, odd ones split: cached = step 0 only (first-block) or the even steps (interval); uncached = 4 + 4 * 2
    assert counter.calls == (1 if "first-block" in spec else 4) + 12
    np.testing.assert_allclose(per_branch, batched, atol=1e-4)
    assert psnr(uncached, per_branch) < 80  # the split run really cached


def test_bad_options_and_unsupported_models(dit):
    for spec, message in [
        ("blockcache(mode=fast)", "choose one of first-block, interval"),
        ("blockcache(threshold=-0.1)", "threshold must be a number >= 0 or none, got -0.1"),
        ("blockcache(interval=0)", "interval must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(AcceleratorError, match=message):
            dit.accelerate(spec)
    with pytest.raises(AcceleratorError, match="conflicts with blockcache.*denoiser.blocks"):
        dit.accelerate("blockcache(mode=first-block);blockcache(mode=interval)")
    assert [str(c) for c in dit.accelerators] == ["scheduler(name=dpm++2m,steps=8)"]
    sd = FastPipeline(make_pipeline("tiny-sd", "test"))
    with pytest.raises(UnsupportedModelError, match="blockcache needs a transformer.*UNet2DConditionModel.*deepcache"):
        sd.accelerate("blockcache(mode=interval)")
    assert sd.accelerators == ()
    with pytest.raises(UnsupportedModelError, match="deepcache needs a UNet.*DiTTransformer2DModel"):
        dit.accelerate("deepcache")


@pytest.mark.parametrize("mode", ["first-block", "teacache"])
def test_residual_modes_read_the_image_tokens_where_the_last_blocks_join_the_stream(mode):
    # Flux.2's single-stream blocks return the joined text+image sequence (it once crashed mid-call with a size
    # mismatch, then was refused): the residual is read from the trailing image tokens. Threshold 0 never skips
    # (the plain images, exactly); a large one skips every middle step, and the images stay close and finite.
    from fastdiff.core.inputs import make_inputs

    fp = FastPipeline(make_pipeline("tiny-flux2", "test"))

    def run():
        kwargs = make_inputs(fp.pipe, 1)
        return fp(**kwargs, num_inference_steps=5, output_type="np", generator=torch.manual_seed(0)).images

    plain = run()
    handle = fp.accelerate(f"blockcache(mode={mode},threshold=0)")
    np.testing.assert_array_equal(run(), plain)
    assert handle.handles[0].info["state"].skipped == 0
    handle.remove()
    handle = fp.accelerate(f"blockcache(mode={mode},threshold=100)")
    cached = run()
    assert handle.handles[0].info["state"].skipped >= 2 and np.isfinite(cached).all()
    assert 20 < psnr(cached, plain) < 200
    handle.remove()
    np.testing.assert_array_equal(run(), plain)


@pytest.mark.parametrize("mode", ["first-block", "teacache"])
def test_residual_modes_pass_every_habit_of_the_matrix_on_flux2(mode):
    # the matrix's own cell runs blockcache in interval mode; these modes read the joined stream's image tokens
    from fastdiff.eval.compat import check_cell

    pipe = make_pipeline("tiny-flux2", "test")
    pipe.set_progress_bar_config(disable=True)
    cell = check_cell(pipe, f"blockcache(mode={mode},threshold=0.3)", "tiny-flux2")
    assert cell.status == "ok", cell.failures
