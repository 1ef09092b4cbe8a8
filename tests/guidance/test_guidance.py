"""cfg-interval: guidance only inside a window of the trajectory, conditional branch alone outside it."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, UNet2DModel
from diffusers.hooks import ModelHook
from helpers import call, tiny_pipe

import fastdiff
from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.hooks import install_hook
from fastdiff.core.models import UnsupportedModelError
from fastdiff.zoo.pipelines import ClassConditionalPipeline
from fastdiff.zoo.tiny import make_pipeline

STEPS = 6
FAMILIES = ("tiny-sd", "tiny-sdxl", "tiny-dit", "digits")


def make_digits_like() -> ClassConditionalPipeline:
    """A small random ClassConditionalPipeline shaped like the digits reference (16px, 10 classes + null)."""
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        num_class_embeds=11,
        norm_num_groups=8,
    )
    return ClassConditionalPipeline(unet=unet.eval(), scheduler=DDIMScheduler(clip_sample=False))


run = functools.partial(call, steps=STEPS, guidance=4.0)


@pytest.fixture(scope="module")
def pipes():
    out = {name: tiny_pipe(name) for name in FAMILIES if name != "digits"}
    out["digits"] = make_digits_like()
    out["digits"].set_progress_bar_config(disable=True)
    return out


@pytest.fixture
def fp(request, pipes):
    wrapped = FastPipeline(pipes[request.param])
    yield wrapped
    wrapped.unwrap()


every_family = pytest.mark.parametrize("fp", FAMILIES, indirect=True)
uncond_and_cond_first = pytest.mark.parametrize("fp", ["tiny-sd", "tiny-dit"], indirect=True)


class Observer(ModelHook):
    """Records (step, branches, batch) of each denoiser call it sees, and its output."""

    def __init__(self, context):
        super().__init__()
        self.context, self.calls, self.outputs = context, [], []

    def pre_forward(self, module, *args, **kwargs):
        self.calls.append((self.context.step, self.context.branches, args[0].shape[0]))
        return args, kwargs

    def post_forward(self, module, output):
        tensor = output[0] if isinstance(output, tuple) else output.sample
        self.outputs.append(tensor.clone())
        return output


@uncond_and_cond_first
def test_full_window_is_bit_identical_and_remove_restores(fp):
    base = run(fp)
    handle = fp.accelerate("cfg-interval")  # default [0, 1): guidance at every step
    np.testing.assert_array_equal(run(fp), base)
    handle.remove()
    fp.accelerate("cfg-interval(start=0.3,end=0.7)").remove()
    np.testing.assert_array_equal(run(fp), base)


@every_family
def test_empty_window_equals_no_guidance(fp):
    # Outside the window the conditional branch alone runs, so an empty window is guidance_scale=1
    # (tolerance 1e-6: same inputs, same batch size; observed bit-identical on CPU).
    unguided = run(fp, guidance=1.0)
    fp.accelerate("cfg-interval(start=0.0,end=0.0)")
    np.testing.assert_allclose(run(fp), unguided, atol=1e-6)
    assert fp.context.nfe == STEPS


@every_family
def test_window_halves_batch_outside_and_hooks_inside_see_cond(fp):
    inner = Observer(fp.context)
    inner_handle = install_hook(fp.denoiser, inner, "test.inner")  # installed first: inside cfg-interval
    fp.accelerate("cfg-interval(start=0.3,end=0.6)")  # guided steps of 6: 2 and 3
    outer = Observer(fp.context)
    outer_handle = install_hook(fp.denoiser, outer, "test.outer")  # outside cfg-interval
    try:
        images = run(fp)
    finally:
        outer_handle.remove()
        inner_handle.remove()
    guided = [s for s in range(STEPS) if 0.3 <= s / STEPS < 0.6]
    assert guided == [2, 3]
    layout = fp.context.cfg_layout
    for (step, branches, batch), (_, outer_branches, outer_batch) in zip(inner.calls, outer.calls):
        assert outer_batch == 4 and outer_branches == layout
        assert (branches, batch) == ((layout, 4) if step in guided else (("cond",), 2))
    for step, out in enumerate(outer.outputs):  # unguided steps: both halves are the conditional output
        first, second = out.chunk(2)
        assert torch.equal(first, second) == (step not in guided)
    assert fp.context.branches == layout and fp.context.nfe == STEPS
    assert np.isfinite(images).all() and images.shape[0] == 2


@uncond_and_cond_first
def test_partial_window_lies_between_and_is_stateless(fp):
    guided, unguided = run(fp), run(fp, guidance=1.0)
    handle = fp.accelerate("cfg-interval(start=0.2,end=0.8)")
    again = fp.accelerate("cfg-interval(start=0.2,end=0.8)")  # applying twice is applying once
    assert len(fp.accelerators) == 1
    first, second = run(fp), run(fp)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, guided) and not np.array_equal(first, unguided)
    again.remove()
    handle.remove()
    np.testing.assert_array_equal(run(fp), guided)


@pytest.mark.parametrize("fp", ["tiny-sd"], indirect=True)
def test_guidance_off_is_untouched(fp):
    base = run(fp, guidance=1.0)
    fp.accelerate("cfg-interval(start=0.5,end=1.0)")
    np.testing.assert_array_equal(run(fp, guidance=1.0), base)


def test_unsupported_pipeline_and_bad_values(pipes):
    fp = FastPipeline(make_pipeline("tiny-ddpm", "test"))
    with pytest.raises(UnsupportedModelError, match="DDPMPipeline has none"):
        fp.accelerate("cfg-interval(start=0.2,end=0.8)")
    assert fp.accelerators == ()
    with pytest.raises(AcceleratorError, match=r"start must be a number in \[0, 1\], got 1.5"):
        fastdiff.parse("cfg-interval(start=1.5)")
    with pytest.raises(AcceleratorError, match=r"start \(0.8\) must be <= end \(0.2\)"):
        fastdiff.parse("cfg-interval(start=0.8,end=0.2)")
    sd = FastPipeline(pipes["tiny-sd"])
    sd.accelerate("cfg-interval(start=0.2)")
    with pytest.raises(AcceleratorError, match="conflicts with"):
        sd.accelerate("cfg-interval(start=0.5)")
    sd.unwrap()
