"""benchmarks/flow_caching.py: diffusers' first-block cache runs on SD3 and matches fastdiff's at one threshold."""

from __future__ import annotations

import numpy as np
from helpers import tiny_pipe

from fastdiff import FastPipeline


def test_diffusers_first_block_cache_runs_on_sd3_with_the_pass_through(monkeypatch):
    from benchmarks import flow_caching as bench

    monkeypatch.setattr(bench, "STEPS", 6)
    monkeypatch.setattr(bench, "GUIDANCE", {"scale": 4.0})
    fp = FastPipeline(tiny_pipe("tiny-sd3"))
    prompts = ["a red fox", "a blue car"]
    plain, _, plain_calls = bench.run(fp, bench.setting("none"), prompts)
    ours, _, ours_calls = bench.run(fp, bench.setting("blockcache(mode=first-block,threshold=10)"), prompts)
    theirs, _, their_calls = bench.run(fp, bench.setting("hf-fbc:10"), prompts)
    np.testing.assert_array_equal(ours, theirs)
    assert plain_calls == 6 and ours_calls == their_calls < 6  # steps skipped, the same ones
    assert not np.array_equal(ours, plain)
    last = fp.denoiser.transformer_blocks[-1]
    assert not getattr(last, "_diffusers_hook", None) or not last._diffusers_hook.hooks  # every hook removed
    np.testing.assert_array_equal(bench.run(fp, bench.setting("none"), prompts)[0], plain)
