"""Calibrate ``blockcache(mode=first-block)``: the largest threshold that keeps one call within a PSNR budget.

As MagCache calibrates its ratios on one call, ``fit_first_block`` runs one seeded call of the model uncached,
recording the first block's residual change at every step, then runs the same call cached at candidate
thresholds and keeps the largest whose images stay within ``psnr`` dB of the uncached ones (the worst image of
the batch counts). ``fastdiff fit-first-block`` writes the result as a fit file for
``blockcache(mode=first-block,fit=FIT.json)``.

The candidates are the changes the uncached call measured: a threshold between two of them makes the same
decision at every step as the lower one, as long as the steps before stay computed, so the search loses nothing
there. Once a step is skipped, later changes are measured against an older step on inputs that moved, and the
cached call may skip steps the candidates do not predict; its images are what is measured, never predicted.
The search is a bisection over the sorted candidates (about log2(steps) cached calls) and assumes PSNR falls
as the threshold grows. That holds mostly, not strictly (a larger threshold can skip an earlier step and then
a different, later set): every try is recorded, and the fit's threshold is a measured one within the budget,
but a larger candidate that was never tried could also be.

Example::

    from fastdiff.cache.calibrate import fit_first_block

    fit = fit_first_block(fp, dict(prompt=["a fox"] * 4, num_inference_steps=28, output_type="np"), psnr=30)
    fp.accelerate(f"blockcache(threshold={fit['threshold']})")   # or write it out: fit=FIT.json
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastdiff.core.tensors import pixels

DEFAULT_PSNR = 30.0  # dB, worst image: an RMS error of about 3% of the pixel range, which tests call close


def worst_psnr(images: np.ndarray, reference: np.ndarray) -> float:
    """The lowest PSNR in dB over the samples of ``images`` (in [0, 1]) against ``reference``; inf if equal."""
    a, b = np.asarray(images, np.float64), np.asarray(reference, np.float64)
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(axis=1).max()
    return math.inf if mse == 0 else float(10 * np.log10(1.0 / mse))


def run_first_block(fp, call: dict, seed: int, threshold: float) -> tuple[np.ndarray, list]:
    """One call of ``fp`` with ``call``'s kwargs and a fresh ``seed`` generator under first-block caching at
    ``threshold`` (-inf: never skip, the uncached call); its images and per-evaluation trace (step, change,
    skipped)."""
    from fastdiff.cache.blockcache import BlockCache

    handle = fp.accelerate(BlockCache(mode="first-block", threshold=max(threshold, 0.0)))
    try:
        state = handle.handles[0].info["state"]
        state.threshold = threshold  # -inf: the uncached call with its changes measured; else as given
        images = pixels(fp(**call, generator=torch.Generator().manual_seed(seed)))
    finally:
        handle.remove()
    return np.asarray(images), list(state.trace)


def computed_steps(trace: list) -> list[int]:
    """The steps where some evaluation ran the blocks."""
    return sorted({step for step, _, skipped in trace if not skipped})


def fit_first_block(fp, call: dict, psnr: float = DEFAULT_PSNR, seed: int = 1000) -> dict:
    """The largest candidate first-block threshold whose cached call of ``fp`` (a FastPipeline) with ``call``'s
    kwargs (``output_type="np"``; seeded with ``seed``) stays within ``psnr`` dB of the uncached call.

    Returns the JSON-ready fit: ``threshold`` (0.0 where no candidate fits: it skips nothing), ``psnr`` reached
    (None: identical images), ``computed_steps`` / ``total_steps``, ``candidates`` and every try.
    """
    if not math.isfinite(psnr) or psnr <= 0:
        raise ValueError(f"psnr must be a finite number of dB > 0, got {psnr}")
    reference, trace = run_first_block(fp, call, seed, -math.inf)
    steps = sorted({step for step, _, _ in trace})
    candidates = sorted({change for _, change, _ in trace if change is not None})
    tries: dict[float, dict] = {}

    def measure(threshold: float) -> dict:
        images, cached = run_first_block(fp, call, seed, threshold)
        reached = worst_psnr(images, reference)
        computed = computed_steps(cached)
        tries[threshold] = {
            "threshold": threshold,
            "psnr": None if math.isinf(reached) else round(reached, 4),
            "computed_steps": len(computed),
            "computed": computed,
        }
        return tries[threshold]

    def fits(found: dict) -> bool:
        return found["psnr"] is None or found["psnr"] >= psnr

    low, high = -1, len(candidates)  # candidates[low] fits (-1: threshold 0), candidates[high] does not
    while high - low > 1:
        middle = (low + high) // 2
        if fits(measure(candidates[middle])):
            low = middle
        else:
            high = middle
    if low >= 0:
        chosen = tries[candidates[low]]
    else:
        chosen = {"threshold": 0.0, "psnr": None, "computed_steps": len(steps), "computed": steps}
    return {
        "mode": "first-block",
        "model": type(fp.denoiser).__name__,
        "threshold": chosen["threshold"],
        "psnr_budget": psnr,
        "psnr": chosen["psnr"],
        "computed_steps": chosen["computed_steps"],
        "total_steps": len(steps),
        "computed": chosen["computed"],
        "next_candidate": candidates[high] if high < len(candidates) else None,
        "candidates": candidates,
        "tries": sorted(tries.values(), key=lambda t: t["threshold"]),
    }
