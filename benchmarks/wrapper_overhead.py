"""Overhead of FastPipeline (no accelerators) over the raw diffusers pipeline, interleaved to cancel drift.

Run:  .venv/bin/python benchmarks/wrapper_overhead.py --size bench --steps 20 --pairs 5 --threads 1

Calls alternate raw, wrapped, raw, wrapped ... on the same pipeline object with the same seed; the
printed ratios are median(wrapped) / median(raw) of process CPU time and of wall time, and the images are
checked to be bit-identical.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff import FastPipeline
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-sd")
    parser.add_argument("--size", default="bench", choices=["test", "bench"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default="benchmarks/results/wrapper_overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pipe = make_pipeline(args.model, args.size)
    pipe.set_progress_bar_config(disable=True)
    call = {
        "prompt": "a photograph of an astronaut riding a horse",
        "num_inference_steps": args.steps,
        "output_type": "np",
    }

    def run(fn):
        start, cpu = time.perf_counter(), time.process_time()
        images = fn(**call, generator=torch.Generator().manual_seed(0)).images
        return (time.perf_counter() - start, time.process_time() - cpu), images

    fp = FastPipeline(pipe)
    run(pipe), run(fp)  # warm-up
    raw, wrapped = [], []
    for _ in range(args.pairs):
        t_raw, img_raw = run(pipe)
        t_fp, img_fp = run(fp)
        raw.append(t_raw)
        wrapped.append(t_fp)
        assert np.array_equal(img_raw, img_fp), "wrapped output differs from the raw pipeline"
    # Process CPU time (1 thread) is what the wrapper could add; wall time also counts other tenants' load.
    wall = statistics.median(w for w, _ in wrapped) / statistics.median(w for w, _ in raw)
    cpu = statistics.median(c for _, c in wrapped) / statistics.median(c for _, c in raw)
    result = {
        "model": f"{args.model}-{args.size}",
        "steps": args.steps,
        "threads": args.threads,
        "raw_seconds": raw,
        "wrapped_seconds": wrapped,
        "overhead_percent_cpu": 100 * (cpu - 1),
        "overhead_percent_wall": 100 * (wall - 1),
        "loadavg": os.getloadavg(),
    }
    print(
        f"overhead: CPU time {100 * (cpu - 1):+.2f}%, wall time {100 * (wall - 1):+.2f}% over {args.pairs} "
        f"interleaved pairs (outputs bit-identical); load average {os.getloadavg()[0]:.1f}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="wrapper_overhead", indent=2)


if __name__ == "__main__":
    main()
