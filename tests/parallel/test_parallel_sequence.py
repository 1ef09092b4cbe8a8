"""parallel(mode=ulysses|ring): two gloo ranks give the one-process output; refusals; exact remove; a killed rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_dead_rank_ends_the_run, full_only

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.tensors import pixels
from fastdiff.eval.compat import module_state, state_differences
from fastdiff.parallel.launch import launch
from fastdiff.zoo import build

ULYSSES = "parallel(mode=ulysses,devices=2)"
CALLS = {  # the test builds' own sizes; an odd token count on Flux (3 x 3 patches) checks the uneven split
    "tiny-wan": {
        "prompt": ["a red circle"],
        "num_inference_steps": 3,
        "height": 32,
        "width": 32,
        "num_frames": 9,
    },
    "tiny-flux": {"prompt": ["a red circle"], "num_inference_steps": 3, "height": 48, "width": 48},
}


def round_trip(rank: int, world: int, model: str, call: dict, specs: str) -> dict:
    """Worker for ``launch``: the plain call, the call under ``specs``, and the plain call after ``remove()``,
    with what ``remove()`` left changed in the pipeline's modules."""
    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)

    def run():
        return pixels(fp(**call, output_type="np", generator=torch.Generator().manual_seed(0)))

    plain, before = run(), module_state(fp.pipe)
    handle = fp.accelerate(specs)
    accelerated = run()
    handle.remove()
    return {
        "plain": plain,
        "accelerated": accelerated,
        "after": run(),
        "changed": state_differences(before, module_state(fp.pipe)),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq")
    return {name: build(name, root / name, size="test") for name in CALLS}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["tiny-wan", full_only("tiny-flux")])
def test_two_ranks_give_the_one_process_output_and_remove_restores_it(models, name):
    specs = f"forecast(order=1,interval=2,warmup=1);{ULYSSES}"  # composes with a whole-output cache
    out = launch(round_trip, 2, str(models[name]), CALLS[name], specs, timeout_s=120)
    single = round_trip(0, 1, str(models[name]), CALLS[name], "forecast(order=1,interval=2,warmup=1)")
    # half-sequence kernels round differently: measured max difference 6.4e-6 on an 81-frame Wan clip
    np.testing.assert_allclose(out["accelerated"], single["accelerated"], atol=1e-5)
    assert not np.array_equal(out["accelerated"], out["plain"])
    np.testing.assert_array_equal(out["after"], out["plain"])
    assert out["changed"] == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_rank_ends_the_call_with_an_error(models):
    assert_dead_rank_ends_the_run(models["tiny-wan"], ULYSSES, CALLS["tiny-wan"], step=1)


def test_refusals_name_the_problem(models, tmp_path):
    fp = FastPipeline.from_pretrained(models["tiny-flux"])
    before = module_state(fp.pipe)
    with pytest.raises(AcceleratorError, match="torchrun"):
        fp.accelerate(ULYSSES)
    with pytest.raises(AcceleratorError, match="denoiser.tokens"):
        fp.accelerate(f"blockcache(mode=first-block);{ULYSSES}")
    with pytest.raises(AcceleratorError, match="denoiser.tokens"):
        fp.accelerate(f"tome;{ULYSSES}")
    with pytest.raises(AcceleratorError, match="unknown option 'stages'"):
        fp.accelerate("parallel(mode=ulysses,stages=2)")
    with pytest.raises(AcceleratorError, match="log-sum-exp.*'native'"):
        fp.accelerate("parallel(mode=ring,devices=2)")
    assert not fp.accelerators and state_differences(before, module_state(fp.pipe)) == []
    sd3 = FastPipeline.from_pretrained(build("tiny-sd3", tmp_path / "sd3", size="test"))
    with pytest.raises(UnsupportedModelError, match="no context-parallel plan.*SD3Transformer2DModel.*Wan"):
        sd3.accelerate(ULYSSES)
    ltx = FastPipeline.from_pretrained(build("tiny-ltx", tmp_path / "ltx", size="test"))
    with pytest.raises(UnsupportedModelError, match="LTXVideoTransformer3DModel: diffusers' Ulysses .* mask"):
        ltx.accelerate(ULYSSES)
    with pytest.raises(AcceleratorError, match="devices must be a multiple of 2 and >= 4, got 2"):
        sd3.accelerate("parallel(mode=cfg+ulysses,devices=2)")
    assert not ltx.accelerators and not sd3.accelerators


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cfg_and_ulysses_on_four_ranks_give_the_one_process_frames(models):
    """Wan with guidance (cond and uncond as separate calls): ranks 0-1 run the cond branch, 2-3 the uncond one,
    each pair splitting the tokens; the frames equal one process's (measured max difference 0 at 3 steps)."""
    call = dict(CALLS["tiny-wan"], guidance_scale=4.0)
    spec = "parallel(mode=cfg+ulysses,devices=4)"
    out = launch(round_trip, 4, str(models["tiny-wan"]), call, spec, timeout_s=200)
    single = round_trip(0, 1, str(models["tiny-wan"]), call, "promptcache")  # its "plain": one process
    np.testing.assert_allclose(out["accelerated"], single["plain"], atol=1e-5)
    np.testing.assert_array_equal(out["after"], out["plain"])
    assert out["changed"] == []
