"""Hypothesis over ``FastPipeline`` call arguments on tiny models (a UNet, a class-conditional DiT, a flow
transformer), each under several accelerator sets: every call gives images or refuses with a ``ValueError``
(``CallArgumentError`` / ``AcceleratorError``, or the library's NaN check), never another exception; a
``CallArgumentError`` comes before any model work; and after all the calls the handle still removes exactly
(the output is bit-identical to before)."""

import numpy as np
import pytest
import torch
from helpers import tiny_pipe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdiff import FastPipeline
from fastdiff.core.calls import CallArgumentError
from fastdiff.core.pipeline import NonFiniteOutputError
from fastdiff.zoo.tiny_flow import make_flow_pipeline

ACCELERATORS = {
    "tiny-sd": ["", "scheduler(name=dpm++2m,steps=3);deepcache(interval=2)", "tome(ratio=0.5);cfg-interval"],
    "tiny-dit": ["", "scheduler(name=unipc);blockcache(interval=2)", "forecast(interval=2)"],
    "tiny-sd3": ["", "scheduler(name=flow-dpm++2m);blockcache(mode=teacache)", "forecast(interval=2)"],
}
SETTINGS = settings(
    max_examples=14,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
BAD_STEPS = st.one_of(st.integers(-3, 0), st.floats(allow_nan=True), st.booleans(), st.just("2"))


def mostly(valid, invalid):
    """``valid`` nine times in ten (so that most calls run), else ``invalid``."""
    return st.integers(0, 9).flatmap(lambda k: invalid if k == 0 else valid)


def pipeline(name: str):
    pipe = make_flow_pipeline(name) if name == "tiny-sd3" else tiny_pipe(name)
    pipe.set_progress_bar_config(disable=True)
    return FastPipeline(pipe)


@st.composite
def calls(draw, name: str, factor: int) -> dict:
    labels = name == "tiny-dit"
    batch = draw(st.integers(1, 3))
    call = (
        {"class_labels": draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))}
        if labels
        else {"prompt": draw(st.lists(st.sampled_from(["a fox", "", "ü" * 30]), min_size=batch, max_size=batch))}
    )
    bad_steps = BAD_STEPS if name == "tiny-sd3" else st.one_of(BAD_STEPS, st.just(10**6))  # flow: no limit
    call["num_inference_steps"] = draw(mostly(st.integers(1, 4), bad_steps))
    call["guidance_scale"] = draw(
        mostly(st.one_of(st.none(), st.floats(0, 12)), st.sampled_from([float("nan"), float("inf"), "7"]))
    )
    call["output_type"] = draw(mostly(st.sampled_from(["np", "pt", "pil", "latent"]), st.just("jpeg")))
    per_prompt = 1
    if not labels:
        per_prompt = draw(mostly(st.sampled_from([None, 1, 2]), st.integers(-1, 0)))
        call["num_images_per_prompt"] = per_prompt
        side = draw(
            mostly(st.one_of(st.none(), st.integers(1, 48 // factor).map(lambda k: k * factor)), st.integers(-4, 40))
        )
        call["height"] = call["width"] = side
    images = batch * (per_prompt if isinstance(per_prompt, int) and per_prompt > 0 else 1)
    count = draw(mostly(st.sampled_from([-1, images]), st.integers(0, 4)))  # -1: one generator, not a list
    call["generator"] = torch.Generator() if count < 0 else [torch.Generator().manual_seed(i) for i in range(count)]
    return {key: value for key, value in call.items() if value is not None}


def baseline(fp: FastPipeline, name: str) -> np.ndarray:
    call = {"class_labels": [1, 2]} if name == "tiny-dit" else {"prompt": ["a fox", "a car"]}
    if name != "tiny-dit":
        call.update(height=32, width=32)
    return fp(**call, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).images


def fuzz_calls(fp: FastPipeline, name: str) -> dict:
    """Run the generated calls on ``fp``; returns how many gave images, were refused up front, or else."""
    outcomes = {"images": 0, "refused": 0, "other": []}

    @SETTINGS
    @given(call=calls(name, fp.size_factor()))
    def one(call):
        calls_before = fp.context.call_index
        try:
            output = fp(**call)
        except CallArgumentError as error:
            assert fp.context.call_index == calls_before  # refused before any model work
            outcomes["refused"] += 1
            outcomes.setdefault("arguments", []).append(error.argument)
            return
        except (ValueError, NonFiniteOutputError) as error:  # diffusers' own check, or NaN found loudly
            outcomes["other"].append(f"{type(error).__name__}: {error}"[:160])
            return
        outcomes["images"] += 1
        per_prompt = call.get("num_images_per_prompt", 1)
        assert len(output.images) == len(call.get("prompt", call.get("class_labels"))) * per_prompt

    one()
    return outcomes


@pytest.mark.parametrize("name", list(ACCELERATORS))
@pytest.mark.timeout(600)
def test_calls_give_images_or_a_value_error_and_remove_stays_exact(name):
    fp = pipeline(name)
    before = baseline(fp, name)
    for spec in ACCELERATORS[name]:
        handle = fp.accelerate(spec) if spec else None
        outcomes = fuzz_calls(fp, name)
        print(name, spec, outcomes)
        assert outcomes["images"] >= 4 and outcomes["refused"] >= 2, outcomes  # both sides were exercised
        if handle is not None:
            handle.remove()
        assert np.array_equal(baseline(fp, name), before), spec
