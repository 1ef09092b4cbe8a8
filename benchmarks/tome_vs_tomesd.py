"""fastdiff ``tome`` vs the ``tomesd`` package (0.1.3) vs no merging, side by side in one process.

Three identical pipelines (same seed) are timed round-robin, one call each in turn (the order reversed every
other run), so load on a shared machine hits all three alike; the tome/tomesd ratio is also given as the
median of the per-run ratios. Reports median seconds, speedup over no merging, our time ratio over tomesd's, and PSNR of
each against the unmerged images.

Command (tiny-sd bench size, dpm++2m 20 steps, 1 thread)::

    .venv/bin/python benchmarks/tome_vs_tomesd.py --runs 5 --threads 1

Needs ``pip install tomesd==0.1.3`` (a comparison baseline only; fastdiff does not import it).
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
from fastdiff.eval.bench import ratio_spread
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline

try:
    from fastdiff.eval.fidelity import psnr
except ImportError:  # the eval module may not exist yet in a partial checkout

    def psnr(images, reference):
        mse = float(np.mean((np.asarray(images, np.float64) - np.asarray(reference, np.float64)) ** 2))
        return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


PROMPT = "a photograph of an astronaut riding a horse"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-sd")
    parser.add_argument("--size", default="bench")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--json", default="benchmarks/results/tome_vs_tomesd.json")
    args = parser.parse_args(argv)
    import tomesd

    torch.set_num_threads(args.threads)
    configs = {}
    for name in ("none", "tomesd", "tome"):
        pipe = make_pipeline(args.model, args.size, seed=0)
        pipe.set_progress_bar_config(disable=True)
        fp = FastPipeline(pipe)
        fp.accelerate(f"scheduler(name=dpm++2m,steps={args.steps})")
        if name == "tomesd":
            tomesd.apply_patch(pipe, ratio=args.ratio)
        elif name == "tome":
            fp.accelerate(f"tome(ratio={args.ratio})")
        configs[name] = fp
    inputs = {"prompt": [PROMPT], "guidance_scale": 7.5, "output_type": "np"}  # bench's default SD batch

    def call(fp):
        return fp(**inputs, generator=torch.Generator().manual_seed(0)).images

    images = {name: call(fp) for name, fp in configs.items()}  # warm-up, and the images compared
    wall = {name: [] for name in configs}
    cpu = {name: [] for name in configs}  # CPU seconds: less sensitive than wall time to other processes
    for run in range(args.runs):
        order = list(configs) if run % 2 == 0 else list(reversed(configs))  # no config always goes first
        for name in order:
            fp = configs[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            call(fp)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    median = {name: statistics.median(s) for name, s in wall.items()}
    median_cpu = {name: statistics.median(s) for name, s in cpu.items()}
    rows = [
        {
            "name": name,
            "seconds_median": median[name],
            "seconds": wall[name],
            **ratio_spread(wall[name], wall["none"], "speedup", baseline=name == "none"),
            "cpu_seconds_median": median_cpu[name],
            "cpu_seconds": cpu[name],
            **ratio_spread(cpu[name], cpu["none"], "cpu_speedup", baseline=name == "none"),
            "psnr": None if name == "none" else psnr(images[name], images["none"]),
        }
        for name in configs
    ]
    result = {
        "model": f"{args.model}:{args.size}",
        "settings": {
            "steps": args.steps,
            "runs": args.runs,
            "threads": args.threads,
            "ratio": args.ratio,
            "sampler": "dpm++2m",
            "inputs": {k: v for k, v in inputs.items() if k != "prompt"},
            "load_average_end": os.getloadavg(),
        },
        "configs": rows,
        "tome_vs_tomesd_time_ratio": median["tomesd"] / median["tome"],
        "tome_vs_tomesd_cpu_time_ratio": median_cpu["tomesd"] / median_cpu["tome"],
        # Per run (the two calls were adjacent or one apart): less exposed to load that drifts over minutes.
        "tome_vs_tomesd_paired_cpu_ratio": statistics.median(a / b for a, b in zip(cpu["tomesd"], cpu["tome"])),
        "tome_vs_tomesd_paired_wall_ratio": statistics.median(a / b for a, b in zip(wall["tomesd"], wall["tome"])),
        "tome_minus_tomesd_psnr_db": rows[2]["psnr"] - rows[1]["psnr"],
    }
    for row in rows:
        psnr_text = "-" if row["psnr"] is None else f"{row['psnr']:.2f} dB"
        print(
            f"{row['name']:8s} {row['seconds_median']:8.3f} s  speedup {row['speedup']:.3f}x  "
            f"(CPU {row['cpu_seconds_median']:.3f} s, {row['cpu_speedup']:.3f}x)  PSNR {psnr_text}"
        )
    print(
        f"tome time ratio vs tomesd (tomesd s / tome s): {result['tome_vs_tomesd_time_ratio']:.3f} wall, "
        f"{result['tome_vs_tomesd_cpu_time_ratio']:.3f} CPU"
    )
    print(
        f"paired per run: {result['tome_vs_tomesd_paired_wall_ratio']:.3f} wall, "
        f"{result['tome_vs_tomesd_paired_cpu_ratio']:.3f} CPU"
    )
    print(f"tome PSNR - tomesd PSNR: {result['tome_minus_tomesd_psnr_db']:+.2f} dB")
    print(f"load average: {os.getloadavg()}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="tome_vs_tomesd", indent=2)
    return result


if __name__ == "__main__":
    main()
