"""The overlapped exchange against the blocking one, in one launch: digits async calls (500 images, guidance 2,
dpm++2m 20, ``warmup=2,extrapolate=1``) alternating the overlapped and the blocking exchange strategy once the cut has settled, the
order swapped every pair; the images must be identical. ``speedup`` is blocking / overlapped (ratio of the
medians; ``speedup_min`` / ``_max`` over the pairs). Run alone, under the shared lock::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/parallel_async_overlap_ab.py --pairs 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from parallel_async_profile import digits_bench_call  # benchmarks/ is the script's directory

from fastdiff.eval.bench import ratio_spread
from fastdiff.eval.record import write_record
from fastdiff.parallel.async_exchange import BlockingExchange, OverlappedExchange
from fastdiff.parallel.launch import launch

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = "scheduler(name=dpm++2m,steps=20);parallel(mode=async,devices=2,warmup=2,extrapolate=1)"


def alternate(rank: int, world: int, model: str, call: dict, pairs: int) -> dict:
    import torch.distributed as dist

    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    handle = fp.accelerate(SPECS)
    state = next(h.state for h in handle.handles if "state" in h.info)

    def one():
        dist.barrier()
        start = time.perf_counter()
        images = fp(**call, output_type="np", generator=torch.Generator().manual_seed(0)).images
        return time.perf_counter() - start, images

    while not state.settled:  # the cut is re-made on staged timings until it is kept
        one()
    seconds: dict[str, list[float]] = {"overlapped": [], "blocking": []}
    images = {}
    for pair in range(pairs):
        for arm in ("overlapped", "blocking")[:: 1 if pair % 2 == 0 else -1]:
            state.set_exchange(OverlappedExchange() if arm == "overlapped" else BlockingExchange())
            took, images[arm] = one()
            seconds[arm].append(round(took, 2))
    spread = ratio_spread(seconds["overlapped"], seconds["blocking"])  # blocking / overlapped, per pair
    return {**seconds, **spread, "identical": bool((images["overlapped"] == images["blocking"]).all())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "parallel_async_overlap_ab.json")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    args = parser.parse_args()
    result = launch(alternate, 2, *digits_bench_call(args.cache), args.pairs, timeout_s=1500)
    print(json.dumps(result), flush=True)
    RESULTS.mkdir(exist_ok=True)
    write_record(args.out, {"specs": SPECS, "images": 500, **result}, benchmark="parallel_async_overlap_ab")


if __name__ == "__main__":
    main()
