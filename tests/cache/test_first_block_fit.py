"""``fastdiff fit-first-block`` on tiny SD3: the threshold it fits is the largest candidate within the PSNR budget
on the calibration call, ``blockcache(mode=first-block,fit=...)`` skips the steps that threshold decides (the
default threshold skips none), and fit files that are missing, malformed or made for another model or mode are
refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fastdiff import AcceleratorError, FastPipeline, UnsupportedModelError
from fastdiff.cache.calibrate import worst_psnr
from fastdiff.core.inputs import make_inputs
from fastdiff.core.spec import parse
from fastdiff.zoo.tiny import make_pipeline

STEPS, BATCH, SEED = 8, 2, 1000
# Random weights: on these 8 steps the first block's residual changes by 0.19-0.39 a step, and cached images stay
# 67-92 dB from the uncached ones; 80 dB keeps some steps skipped and some computed (asserted below).
BUDGET = 80.0


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A saved tiny SD3, the fit the command wrote for it, and a FastPipeline over it."""
    from fastdiff.cli.main import main

    root = tmp_path_factory.mktemp("first-block-fit")
    make_pipeline("tiny-sd3").save_pretrained(root / "model")
    out = root / "fit.json"
    main(
        [
            "fit-first-block",
            str(root / "model"),
            "--steps",
            str(STEPS),
            "--batch",
            str(BATCH),
            "--psnr",
            str(BUDGET),
            "--seed",
            str(SEED),
            "--out",
            str(out),
        ]
    )
    fp = FastPipeline.from_pretrained(root / "model")
    fp.set_progress_bar_config(disable=True)
    return fp, out, json.loads(out.read_text())


def images_and_trace(fp, spec: str | None) -> tuple[np.ndarray, list]:
    """The calibration call (the model's bench inputs, batch 2, seed 1000) under ``spec``; its images and, with a
    first-block spec, its trace of (step, change, skipped)."""
    handle = fp.accelerate(spec) if spec else None
    try:
        kwargs = make_inputs(fp.pipe, BATCH)
        images = fp(
            **kwargs, num_inference_steps=STEPS, output_type="np", generator=torch.Generator().manual_seed(SEED)
        ).images
        trace = list(handle.handles[0].info["state"].trace) if handle else []
    finally:
        if handle is not None:
            handle.remove()
    return images, trace


def skipped_steps(trace) -> list[int]:
    return [step for step, _, skipped in trace if skipped]


def test_fit_is_the_largest_candidate_within_the_budget_on_the_calibration_call(fitted):
    fp, out, fit = fitted
    assert fit["mode"] == "first-block" and fit["model"] == "SD3Transformer2DModel"
    assert fit["psnr_budget"] == BUDGET and fit["total_steps"] == STEPS
    assert 1 < fit["computed_steps"] < STEPS  # the budget keeps some steps skipped and some computed
    assert fit["command"].startswith("fastdiff fit-first-block ") and f"--psnr {BUDGET:g}" in fit["command"]
    assert fit["settings"]["batch"] == BATCH and fit["settings"]["seed"] == SEED and fit["date"]
    plain, _ = images_and_trace(fp, None)  # no cache at all: what the calibration measured against
    cached, trace = images_and_trace(fp, f"blockcache(mode=first-block,fit={out})")
    reached = worst_psnr(cached, plain)
    assert reached >= BUDGET and reached == pytest.approx(fit["psnr"], abs=1e-3)
    assert sorted(set(range(STEPS)) - set(skipped_steps(trace))) == fit["computed"]
    # the candidates are the uncached call's changes, ascending; the next one above the fit breaks the budget
    _, uncached = images_and_trace(fp, "blockcache(mode=first-block,threshold=0)")
    assert fit["candidates"] == sorted(change for _, change, _ in uncached if change is not None)
    above = fit["candidates"].index(fit["threshold"]) + 1
    assert above < len(fit["candidates"]) and fit["next_candidate"] == fit["candidates"][above]
    broken, _ = images_and_trace(fp, f"blockcache(mode=first-block,threshold={fit['next_candidate']!r})")
    assert worst_psnr(broken, plain) < BUDGET
    # a bisection: about log2(candidates) cached calls, each recorded with what it measured
    assert len(fit["tries"]) <= math.ceil(math.log2(len(fit["candidates"]) + 1))
    assert {t["threshold"] for t in fit["tries"]} >= {fit["threshold"], fit["next_candidate"]}
    for t in fit["tries"]:
        assert (t["psnr"] >= BUDGET) == (t["threshold"] <= fit["threshold"]), t
        assert t["computed_steps"] == len(t["computed"])


def test_the_fit_decides_the_skipped_steps_where_the_default_threshold_skips_none(fitted, tmp_path):
    fp, out, fit = fitted
    _, default = images_and_trace(fp, "blockcache(mode=first-block)")
    assert skipped_steps(default) == [] and min(c for _, c, _ in default if c is not None) > 0.05
    _, with_fit = images_and_trace(fp, f"blockcache(mode=first-block,fit={out})")
    skipped = skipped_steps(with_fit)
    assert 0 < len(skipped) < STEPS - 1 and skipped == sorted(set(range(STEPS)) - set(fit["computed"]))
    for step, change, skip in with_fit:  # each decision follows the fitted threshold
        assert step == 0 or skip == (change <= fit["threshold"]), step
    everything = tmp_path / "all.json"  # a threshold above every change skips every step after the first
    everything.write_text(json.dumps({**fit, "threshold": 10.0}))
    _, all_skipped = images_and_trace(fp, f"blockcache(mode=first-block,fit={everything})")
    assert skipped_steps(all_skipped) == list(range(1, STEPS))


def test_fit_refusals(fitted, tmp_path):
    fp, out, fit = fitted
    for spec, message in [
        (f"blockcache(mode=first-block,threshold=0.1,fit={out})", "threshold or fit.*not both"),
        (f"blockcache(threshold=0.05,fit={out})", "threshold or fit.*not both"),
        (f"blockcache(mode=interval,fit={out})", "fit is an option of mode=first-block and mode=teacache"),
    ]:
        with pytest.raises(AcceleratorError, match=message):
            parse(spec)
    config = parse(f"blockcache(fit={tmp_path / 'later.json'})")[0]  # the file is read at apply, not here
    assert parse(str(config)) == [config]
    files = {
        "missing.json": None,
        "garbled.json": "{not json",
        "list.json": "[1, 2]",
        "no-threshold.json": json.dumps({k: v for k, v in fit.items() if k != "threshold"}),
        "negative.json": json.dumps({**fit, "threshold": -1}),
        "text.json": json.dumps({**fit, "threshold": "0.3"}),
        "dit.json": json.dumps({**fit, "model": "DiTTransformer2DModel"}),
        "teacache.json": json.dumps({"model": "SD3Transformer2DModel", "coefficients": [1.0, 0.0]}),
    }
    messages = {
        "missing.json": "does not exist.*fastdiff fit-first-block",
        "garbled.json": "is not JSON",
        "list.json": "not a JSON object",
        "no-threshold.json": "no finite 'threshold' >= 0",
        "negative.json": "no finite 'threshold' >= 0",
        "text.json": "no finite 'threshold' >= 0",
        "dit.json": "fitted on DiTTransformer2DModel, not on SD3Transformer2DModel",
        "teacache.json": "made for mode=teacache, not mode=first-block.*fit-first-block",
    }
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        error = UnsupportedModelError if name == "dit.json" else AcceleratorError
        with pytest.raises(error, match=messages[name]):
            fp.accelerate(f"blockcache(mode=first-block,fit={tmp_path / name})")
        assert fp.accelerators == (), name
    with pytest.raises(AcceleratorError, match="made for mode=first-block, not mode=teacache.*fit-teacache"):
        fp.accelerate(f"blockcache(mode=teacache,fit={out})")
    assert fp.accelerators == ()
