"""Wrapping never changes a call that works unwrapped: for every pipeline class the zoo builds (the tiny
models, the video models and their img2img / inpaint / ControlNet / adapter variants), the same
seeded call gives bit-identical images unwrapped, wrapped in a FastPipeline with no accelerator, and after
``unwrap()``."""

import numpy as np
import pytest

from fastdiff import FastPipeline
from fastdiff.eval.compat import _call as seeded_call
from fastdiff.zoo.tiny import PIPELINE_MAKERS, make_pipeline
from fastdiff.zoo.tiny_flow import FLOW_MAKERS
from fastdiff.zoo.tiny_video import VIDEO_MAKERS
from fastdiff.zoo.variants import VARIANTS

NAMES = sorted({*PIPELINE_MAKERS, *FLOW_MAKERS, *VIDEO_MAKERS, *VARIANTS})


@pytest.mark.parametrize("name", NAMES)
def test_wrapped_call_is_bit_identical_to_the_unwrapped_one(name):
    pipe = make_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    seeded_call(pipe, pipe)  # a fresh pipeline's first call installs transformers' lazy hooks
    plain = seeded_call(pipe, pipe)
    fp = FastPipeline(pipe)
    wrapped = seeded_call(fp, pipe)
    assert fp.unwrap() is pipe
    after = seeded_call(pipe, pipe)
    assert np.isfinite(plain).all()
    assert np.array_equal(wrapped, plain), type(pipe).__name__
    assert np.array_equal(after, plain), type(pipe).__name__
