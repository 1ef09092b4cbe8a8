"""benchmarks/flow_caching.py: diffusers' first-block cache runs on SD3 and matches fastdiff's at a threshold
that skips some steps and computes others."""

from __future__ import annotations

import numpy as np
from helpers import tiny_pipe

from fastdiff import FastPipeline


def test_diffusers_first_block_cache_runs_on_sd3_with_the_pass_through_and_skips_the_same_steps(monkeypatch):
    from benchmarks import flow_caching as bench

    monkeypatch.setattr(bench, "STEPS", 12)
    monkeypatch.setattr(bench, "GUIDANCE", {"scale": 4.0})
    fp = FastPipeline(tiny_pipe("tiny-sd3"))
    prompts = ["a red fox", "a blue car"]
    computed: list[int] = []  # steps whose last block ran: a skipped block never calls its attention's to_q
    last = fp.denoiser.transformer_blocks[-1]
    hook = last.attn.to_q.register_forward_pre_hook(lambda *_: computed.append(fp.context.step))

    def run(text):
        computed.clear()
        images, _, calls = bench.run(fp, bench.setting(text), prompts)
        assert calls == len(computed)  # the benchmark's count of the last block's attention
        return images, list(computed)

    plain, plain_steps = run("none")
    # The first block's residual changes by 0.17-0.42 against the last computed step on this random model; the
    # closest calls are 0.231 (skipped) and 0.279 (computed): 0.255 is 0.024 from each. Here, unlike at 8 steps,
    # comparing with the previous step instead of the last computed one would compute step 4 and not 5.
    ours, our_steps = run("blockcache(mode=first-block,threshold=0.255)")
    theirs, their_steps = run("hf-fbc:0.255")
    hook.remove()
    assert plain_steps == list(range(12))
    assert our_steps == their_steps == [0, 2, 3, 5, 6, 7, 9, 10, 11]  # 1, 4, 8 skipped
    np.testing.assert_array_equal(ours, theirs)
    assert not np.array_equal(ours, plain)
    assert not getattr(last, "_diffusers_hook", None) or not last._diffusers_hook.hooks  # every hook removed
    np.testing.assert_array_equal(bench.run(fp, bench.setting("none"), prompts)[0], plain)


def test_the_cache_selection_picks_the_fastest_candidate_within_every_budget():
    from benchmarks.caching_select import FD_BUDGET, MIN_PSNR, pick

    base = {"name": "euler-28", "cpu_median": 100.0, "accuracy": 1.0, "fd": 12.0, "psnr": None}
    rows = [
        base,
        {
            "name": "a",
            "cpu_median": 30.0,
            "accuracy": 1.0,
            "fd": 12.5,
            "psnr": MIN_PSNR - 1,
        },  # fastest, blurred
        {"name": "b", "cpu_median": 40.0, "accuracy": 0.98, "fd": 12.0, "psnr": 40.0},  # loses 2 points
        {"name": "c", "cpu_median": 45.0, "accuracy": 1.0, "fd": 12.0 * (1 + FD_BUDGET) + 0.1, "psnr": 40.0},
        {"name": "d", "cpu_median": 60.0, "accuracy": 0.995, "fd": 13.0, "psnr": 38.0},  # the pick
        {"name": "e", "cpu_median": 80.0, "accuracy": 1.0, "fd": 11.0, "psnr": 45.0},
    ]
    choice, verdicts = pick(rows, [f"{r['name']}=x" for r in rows[1:]])
    assert choice == "d=x"
    assert [v["within_budget"] for v in verdicts] == [False, False, False, True, True]
    assert pick(rows, ["a=x", "b=x"])[0] == ""  # none within the budgets: no pick
