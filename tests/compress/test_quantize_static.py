"""Static int8 (PT2E, convolutions and linears) on CPU: close to fp32, exact restore, re-apply, refusals."""

from __future__ import annotations

import functools
import platform

import helpers
import numpy as np
import pytest
import torch

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.quantize_static import HOOK_NAME, batch_range
from fastdiff.core.hooks import has_hook

pytest.importorskip("torchao")
pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")


def make_fp() -> FastPipeline:
    return helpers.make_fp("tiny-ddpm")


def call(fp: FastPipeline, batch: int = 2):
    return helpers.call(fp, batch_size=batch)


psnr = functools.partial(helpers.psnr, float64=True)


SPEC = "quantize(mode=int8-static,calibration_batch=2,calibration_steps=3)"


@pytest.mark.full  # inductor compiles every block for each batch size (~20 s each on one core), twice here
def test_int8_static_is_close_to_fp32_and_restores_exactly():
    fp = make_fp()
    before = call(fp)
    state = {k: v.clone() for k, v in fp.denoiser.state_dict().items()}
    handle = fp.accelerate(SPEC)
    blocks = handle.handles[0].blocks
    assert blocks and all(has_hook(fp.denoiser.get_submodule(name), HOOK_NAME) for name in blocks)
    quantized = call(fp)
    assert not np.array_equal(quantized, before)
    assert psnr(quantized, before) > 30  # int8 activations and weights: ~1% of the range
    handle.remove()
    assert not any(has_hook(m, HOOK_NAME) for m in fp.denoiser.modules())
    assert all(torch.equal(v, state[k]) for k, v in fp.denoiser.state_dict().items())
    np.testing.assert_array_equal(call(fp), before)
    again = fp.accelerate(SPEC)  # apply after remove: same result as the first time
    np.testing.assert_allclose(call(fp), quantized, atol=1e-6)
    with pytest.raises(AcceleratorError, match="conflicts with quantize"):
        fp.accelerate("quantize(mode=int8-weight)")
    again.remove()
    np.testing.assert_array_equal(call(fp), before)


def test_hooks_inside_a_quantized_block_are_refused_loudly():
    fp = make_fp()
    fp.accelerate(SPEC + ";compile(backend=eager)")
    with pytest.raises(AcceleratorError, match="would bypass the hooks added inside it"):
        call(fp)


def test_bad_options_and_devices_are_refused():
    with pytest.raises(AcceleratorError, match="apply to mode=int8-static only"):
        make_fp().accelerate("quantize(mode=int8-dynamic,calibration_batch=4)")
    with pytest.raises(AcceleratorError, match="calibration_steps must be an integer >= 1, got 0"):
        make_fp().accelerate("quantize(mode=int8-static,calibration_steps=0)")
    fp = make_fp()
    fp.denoiser.to(torch.float64)
    with pytest.raises(AcceleratorError, match="needs float32 weights"):
        fp.accelerate("quantize(mode=int8-static)")
    assert fp.accelerators == ()
    assert batch_range(1) == (1, 1) and batch_range(63) == (2, 63) and batch_range(64)[0] == 64
