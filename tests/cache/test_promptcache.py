"""promptcache: text-encoder outputs reused across calls, keyed by everything that changes them."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import call

import fastdiff
from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.models import UnsupportedModelError
from fastdiff.zoo.tiny import make_pipeline


@pytest.fixture
def sd(pipes):
    fp = FastPipeline(pipes["tiny-sd"])
    yield fp
    fp.unwrap()


class EncoderRuns:
    """Counts real runs of a text encoder's embeddings (a cache hit never reaches them)."""

    def __init__(self, encoder):
        self.count = 0
        self._handle = encoder.embeddings.register_forward_pre_hook(self._seen)

    def _seen(self, module, args):
        self.count += 1

    def remove(self):
        self._handle.remove()


run = functools.partial(call, steps=2, guidance=7.5)  # SD's usual guidance; extra keywords pass through


def stats(handle):
    return handle.handles[0].stats()  # fp.accelerate groups the handles of the configs it applied


def test_second_call_hits_and_is_bit_identical(sd):
    base = run(sd)
    handle = sd.accelerate("promptcache(size=4)")
    runs = EncoderRuns(sd.pipe.text_encoder)
    try:
        first = run(sd)  # misses: the prompts (one batched call) and the empty negative prompts
        assert stats(handle)["misses"] == 2 and stats(handle)["hits"] == 0 and runs.count == 2
        second = run(sd)
        assert stats(handle)["hits"] == 2 and stats(handle)["misses"] == 2 and runs.count == 2
    finally:
        runs.remove()
    np.testing.assert_array_equal(first, base)
    np.testing.assert_array_equal(second, base)
    assert stats(handle)["entries"] == 2
    handle.remove()
    np.testing.assert_array_equal(run(sd), base)


def test_different_prompt_and_negative_prompt_miss(sd):
    handle = sd.accelerate("promptcache(size=8)")
    run(sd)
    run(sd, prompts=("a green frog", "a blue car"))  # a new prompt batch misses, the negatives hit
    assert (stats(handle)["hits"], stats(handle)["misses"]) == (1, 3)
    with_negative = run(sd, negative_prompt=["blurry", "dark"])
    assert (stats(handle)["hits"], stats(handle)["misses"]) == (2, 4)
    again = run(sd, negative_prompt=["blurry", "dark"])
    assert (stats(handle)["hits"], stats(handle)["misses"]) == (4, 4)
    handle.remove()
    np.testing.assert_array_equal(with_negative, run(sd, negative_prompt=["blurry", "dark"]))
    np.testing.assert_array_equal(again, with_negative)


def test_lru_eviction_at_size_and_no_guidance(sd):
    handle = sd.accelerate("promptcache(size=2)")
    a_uncached = run(sd, prompts=["a"], guidance=1.0)  # guidance off: one encoder call per pipeline call
    for prompt in ("b", "a", "c"):  # a is used again before c arrives, so b is the one evicted
        run(sd, prompts=[prompt], guidance=1.0)
    assert (stats(handle)["hits"], stats(handle)["misses"], stats(handle)["entries"]) == (1, 3, 2)
    np.testing.assert_array_equal(run(sd, prompts=["a"], guidance=1.0), a_uncached)  # hit
    run(sd, prompts=["b"], guidance=1.0)  # miss: evicted
    assert (stats(handle)["hits"], stats(handle)["misses"], stats(handle)["entries"]) == (2, 4, 2)


def test_cache_cannot_be_mutated_and_weights_invalidate(sd):
    handle = sd.accelerate("promptcache(size=4)")
    base = run(sd)
    ids = sd.pipe.tokenizer(["a red fox"], padding="max_length", return_tensors="pt").input_ids
    with torch.no_grad():
        sd.pipe.text_encoder(ids)[0].mul_(0)  # a caller scribbling on a returned (miss) tensor
        sd.pipe.text_encoder(ids)[0].mul_(0)  # ... and on a returned (hit) tensor
        clean = sd.pipe.text_encoder(ids)[0]
    assert clean.abs().sum() > 0
    np.testing.assert_array_equal(run(sd), base)
    weight = sd.pipe.text_encoder.final_layer_norm.bias
    misses = stats(handle)["misses"]
    with torch.no_grad():
        weight.add_(0.5)  # in-place weight change: old entries must not be served
    try:
        changed = run(sd)
        assert stats(handle)["misses"] == misses + 2
        handle.remove()
        np.testing.assert_array_equal(run(sd), changed)
    finally:
        with torch.no_grad():
            weight.sub_(0.5)


def test_sdxl_caches_both_encoders(pipes):
    fp = FastPipeline(pipes["tiny-sdxl"])
    try:
        base = run(fp, guidance=5.0, negative_prompt=["blurry", "dark"])
        handle = fp.accelerate("promptcache")
        again = fp.accelerate("promptcache")  # applying twice is applying once
        assert len(fp.accelerators) == 1
        for _ in range(2):
            np.testing.assert_array_equal(run(fp, guidance=5.0, negative_prompt=["blurry", "dark"]), base)
        per = stats(handle)["encoders"]
        assert set(per) == {"text_encoder", "text_encoder_2"}
        assert all(p == {"hits": 2, "misses": 2, "entries": 2} for p in per.values()), per
        again.remove()
        handle.remove()
        np.testing.assert_array_equal(run(fp, guidance=5.0, negative_prompt=["blurry", "dark"]), base)
    finally:
        fp.unwrap()


def test_unsupported_model_and_bad_values(sd):
    dit = FastPipeline(make_pipeline("tiny-dit", "test"))
    with pytest.raises(UnsupportedModelError, match="promptcache needs a text encoder; DiTPipeline has none"):
        dit.accelerate("promptcache")
    assert dit.accelerators == ()
    with pytest.raises(AcceleratorError, match="size must be an integer >= 1, got 0"):
        fastdiff.parse("promptcache(size=0)")
    sd.accelerate("promptcache(size=2)")
    with pytest.raises(AcceleratorError, match="conflicts with"):
        sd.accelerate("promptcache(size=3)")
