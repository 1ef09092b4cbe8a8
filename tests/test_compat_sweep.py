"""Regressions of the compatibility matrix: cases where an accelerator applied and then failed mid-call, or failed
at apply with another error than a refusal (Z-Image's per-image batch lists under cfg-interval, lowrank on
pipelines that record no default size).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_pipe

from fastdiff import FastPipeline
from fastdiff.core.inputs import default_side, make_inputs
from fastdiff.core.siblings import BUILD_DEFAULTS
from fastdiff.core.tensors import pixels


@pytest.mark.parametrize("prompt,batch", [("a red fox", 8), ("", 4)])
def test_cfg_interval_takes_zimage_images_whole_outside_the_window(prompt, batch):
    """Z-Image takes its batch as lists of per-image tensors. Outside the window cfg-interval took the cond images
    and then cut every tensor in them whose first dimension equalled the batch: 8 images under CFG (16 in the
    list) cut the 16 latent channels (a shape error mid-call); 4 cut the 8 tokens of the empty caption (a silently
    wrong image). With no step in the window the images are those of the unguided call."""
    pipe = tiny_pipe("tiny-zimage")
    fp = FastPipeline(pipe)

    def run(guidance):
        kwargs = dict(make_inputs(pipe, batch), prompt=[prompt] * batch, guidance_scale=guidance)
        return fp(
            **kwargs, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)
        )

    unguided = run(0.0).images
    handle = fp.accelerate("cfg-interval(start=0.0,end=0.0)")
    windowed = run(5.0).images
    np.testing.assert_allclose(windowed, unguided, atol=1e-6)
    handle.remove()
    fp.unwrap()


@pytest.mark.parametrize("family,side", [("tiny-zimage", 1024), ("tiny-cogvideox", 32)])
def test_lowrank_applies_where_the_pipeline_records_no_default_size(family, side):
    """A Z-Image or CogVideoX pipeline built from its components or loaded from a checkpoint records no default
    size (no default_sample_size, no benchmark call) and its call's height defaults to None: lowrank's input
    capture took int(None) (TypeError at apply). The facts give the side (Z-Image's own 1024, CogVideoX's
    sample_height latents), and lowrank applies, runs and restores."""
    pipe = tiny_pipe(family)
    for name in BUILD_DEFAULTS:
        pipe.__dict__.pop(name, None)
    call = dict(make_inputs(pipe, 1, side=32), height=32, width=32, num_inference_steps=2, output_type="np")
    if family == "tiny-cogvideox":
        call["num_frames"] = 9
    fp = FastPipeline(pipe)

    def run():
        return pixels(fp(**call, generator=torch.Generator().manual_seed(0)))

    plain = run()
    handle = fp.accelerate("lowrank(energy=0.9)")
    assert handle.handles[0].layers > 0 and default_side(pipe) == side
    assert np.isfinite(run()).all()
    handle.remove()
    np.testing.assert_array_equal(run(), plain)
    fp.unwrap()
