"""Compatibility matrix of the other flow-matching (and PixArt-Sigma) transformers: SD3 (img2img, ControlNet),
Sana, PixArt-Sigma, Qwen-Image (img2img, inpaint) and Z-Image; expected refusals in tests/flow_matrix.py.
Every flow sampler preset on every family either samples or is refused at ``accelerate()``, never mid-call.
"""

from __future__ import annotations

import numpy as np
import pytest
from flow_matrix import VARIANT_ACCELERATORS, check, pipe_of
from helpers import full_only

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.eval.compat import MATRIX_SPECS, _call, module_state, state_differences
from fastdiff.schedulers.presets import FLOW_PRESETS, PRESETS

BASES = ("tiny-sd3", "tiny-sana", "tiny-pixart-sigma", "tiny-qwen-image", "tiny-zimage")
VARIANTS = ("tiny-sd3-img2img", "tiny-sd3-controlnet", "tiny-qwen-image-img2img", "tiny-qwen-image-inpaint")
EVERY = [a for a in MATRIX_SPECS if a != "compile"]
FAMILIES = (
    "tiny-flux",
    "tiny-flux-schnell",
    "tiny-flux-img2img",
    "tiny-flux2",
    "tiny-flux2-klein",
    *BASES,
    *VARIANTS,
)


@pytest.mark.parametrize("accelerator", EVERY)
@pytest.mark.parametrize("variant", BASES)
def test_cell(variant, accelerator):
    check(variant, accelerator)


@pytest.mark.full  # `make test` runs the Flux inpaint variant (tests/core/test_coexist_flow.py)
@pytest.mark.parametrize("accelerator", VARIANT_ACCELERATORS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_cell(variant, accelerator):
    check(variant, accelerator)


# the variants and schnell/Klein (their bases' transformer and scheduler classes) in `make test-full` only
@pytest.mark.parametrize(
    "variant", [full_only(v, ci=v in BASES or v in ("tiny-flux", "tiny-flux2")) for v in FAMILIES]
)
def test_every_preset_samples_or_is_refused_at_apply(variant):
    """Noise-model presets are refused on flow models and flow presets on noise models (PixArt-Sigma predicts
    noise); a preset that applies samples finite images at 3 and 5 steps; a refusal changes nothing."""
    pipe = pipe_of(variant)
    fp = FastPipeline(pipe)
    flow = variant != "tiny-pixart-sigma"
    base = _call(fp, pipe, steps=3)
    applied = []
    for preset in PRESETS:
        before = module_state(pipe)
        try:
            handle = fp.accelerate(f"scheduler(name={preset})")
        except AcceleratorError as error:
            assert f"name={preset}" in str(error) and type(pipe).__name__ in str(error)
            assert not state_differences(before, module_state(pipe)) and not fp.accelerators
            if (preset in FLOW_PRESETS) != flow:
                assert "predicts" in str(error), str(error)
            continue
        assert (preset in FLOW_PRESETS) == flow, f"{preset} applied to {variant}"
        for steps in (3, 5):
            assert np.isfinite(_call(fp, pipe, steps=steps)).all(), (preset, steps)
        handle.remove()
        applied.append(preset)
    assert applied, f"no sampler preset fits {variant}"
    np.testing.assert_array_equal(_call(fp, pipe, steps=3), base)
    fp.unwrap()


@pytest.mark.parametrize("variant", FAMILIES)
def test_caches_act_on_every_family(variant):
    """forecast skips denoiser calls (or, at=attention, predicts the attention layers' outputs) and
    blockcache(mode=interval) reuses layer outputs on every family (Z-Image's per-image output lists included), so
    none can run silently as a no-op."""
    pipe = pipe_of(variant)
    fp = FastPipeline(pipe)
    handle = fp.accelerate("forecast(order=1,interval=2,warmup=2)")
    assert np.isfinite(_call(fp, pipe, steps=6)).all()
    assert fp.context.nfe < fp.context.denoiser_calls, fp.context  # separate-call CFG: 2 calls a step
    handle.remove()
    handle = fp.accelerate("blockcache(mode=interval,interval=2)")
    assert np.isfinite(_call(fp, pipe, steps=6)).all()
    assert handle.handles[0].state.skipped > 0
    handle.remove()
    base = _call(fp, pipe, steps=6)
    handle = fp.accelerate("forecast(order=1,interval=2,warmup=2,at=attention)")
    forecast = _call(fp, pipe, steps=6)
    assert np.isfinite(forecast).all() and not np.array_equal(forecast, base)  # attention layers predicted
    assert fp.context.nfe == fp.context.denoiser_calls
    handle.remove()
    fp.unwrap()
