"""fastdiff ``deepcache`` vs the ``DeepCache`` package (``DeepCacheSDHelper``) vs no cache, side by side.

Command (tiny-sd bench size, dpm++2m 20 steps, guidance 7.5, one thread; ~10 minutes on a quiet CPU)::

    .venv/bin/python benchmarks/deepcache_vs_package.py --size bench --runs 7 --threads 1

Needs the optional benchmark dependency ``DeepCache==0.1.1`` (``pip install --no-deps DeepCache==0.1.1``).
All configs share one pipeline and run interleaved, one run of each per round in a rotating order, so load
changes on a shared machine hit them alike. Both wall time and process CPU time are recorded: with one thread
CPU time is the compute cost and is far less disturbed by other processes on a shared machine, so
``ours_vs_package`` is the median of the per-round CPU-time ratios (package / ours, > 1 means ours is faster);
``ours_vs_package_wall`` is the same for wall time. Quality is PSNR/SSIM against the uncached images (same seed). A
separate profiled run gives the median UNet time of full and cached steps, to show skipped blocks do no work.
Writes ``benchmarks/results/deepcache_vs_package.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from DeepCache import DeepCacheSDHelper

from fastdiff import FastPipeline
from fastdiff.eval.bench import make_inputs, ratio_spread
from fastdiff.eval.fidelity import psnr, ssim
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline

RESULTS = Path(__file__).parent / "results" / "deepcache_vs_package.json"


def configs(fp: FastPipeline, interval: int, branch: int) -> dict:
    """name -> function that turns the config on and returns the function that turns it off."""

    def package():
        helper = DeepCacheSDHelper(pipe=fp.pipe)
        helper.set_params(cache_interval=interval, cache_branch_id=branch)
        helper.enable()
        return helper.disable

    def ours():
        return fp.accelerate(f"deepcache(interval={interval},branch={branch})").remove

    return {"no cache": lambda: lambda: None, "DeepCache package": package, "fastdiff deepcache": ours}


# The package replaces the UNet's forward, which a FastPipeline refuses to run over: its config calls the plain
# diffusers pipeline (the same scheduler object and step count), the others call through the FastPipeline.
CALLS_PLAIN_PIPELINE = {"DeepCache package"}


def unet_step_times(fp: FastPipeline, call) -> list[tuple[int, float]]:
    """(step, CPU seconds) of every UNet call in one pipeline call (batched guidance: one call per step)."""
    times, start = [], {}
    pre = fp.denoiser.register_forward_pre_hook(lambda *_: start.update(t=time.process_time()))
    post = fp.denoiser.register_forward_hook(lambda *_: times.append((len(times), time.process_time() - start["t"])))
    try:
        call()
    finally:
        pre.remove()
        post.remove()
    return times


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="bench", choices=["test", "bench"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=7, help="timed rounds (each runs every config once)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--guidance", type=float, default=7.5)
    parser.add_argument("--interval", type=int, default=3)
    parser.add_argument("--branch", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    fp = FastPipeline(make_pipeline("tiny-sd", args.size))
    fp.pipe.set_progress_bar_config(disable=True)
    fp.accelerate(f"scheduler(name=dpm++2m,steps={args.steps})")
    inputs = dict(make_inputs(fp.pipe, 1, args.guidance), output_type="np")

    def caller(name: str):
        runner = fp.pipe if name in CALLS_PLAIN_PIPELINE else fp
        kwargs = dict(inputs, num_inference_steps=args.steps)
        return lambda: runner(**kwargs, generator=torch.Generator().manual_seed(0)).images

    table = configs(fp, args.interval, args.branch)
    calls = {name: caller(name) for name in table}
    load_before = os.getloadavg()
    images, nfe, profile = {}, {}, {}
    seconds, cpu = {name: [] for name in table}, {name: [] for name in table}
    for name, enable in table.items():  # warm-up run: the images, NFE and per-step UNet times
        disable = enable()
        try:
            images[name] = calls[name]()
            profile[name] = unet_step_times(fp, calls[name])
            nfe[name] = len(profile[name])
        finally:
            disable()
    names = list(table)
    for r in range(args.runs):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            disable = table[name]()
            try:
                start, start_cpu = time.perf_counter(), time.process_time()
                out = calls[name]()
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
            finally:
                disable()
            assert np.array_equal(out, images[name]), f"{name}: runs differ"
    load_after = os.getloadavg()

    rows = []
    for name in names:
        steps = profile[name]
        full = [s for step, s in steps if step % args.interval == 0] if name != "no cache" else [s for _, s in steps]
        cached = [s for step, s in steps if step % args.interval != 0] if name != "no cache" else []
        rows.append(
            {
                "name": name,
                "seconds_median": statistics.median(seconds[name]),
                "seconds": seconds[name],
                **ratio_spread(seconds[name], seconds["no cache"], "speedup", baseline=name == "no cache"),
                "cpu_seconds_median": statistics.median(cpu[name]),
                "cpu_seconds": cpu[name],
                **ratio_spread(cpu[name], cpu["no cache"], "cpu_speedup", baseline=name == "no cache"),
                "psnr": None if name == "no cache" else psnr(images[name], images["no cache"]),
                "ssim": None if name == "no cache" else ssim(images[name], images["no cache"]),
                "nfe": nfe[name],
                "unet_full_cpu_ms": 1000 * statistics.median(full),
                "unet_cached_cpu_ms": 1000 * statistics.median(cached) if cached else None,
            }
        )
    ours, package = rows[2], rows[1]
    per_round = [p / o for p, o in zip(cpu["DeepCache package"], cpu["fastdiff deepcache"])]
    per_round_wall = [p / o for p, o in zip(seconds["DeepCache package"], seconds["fastdiff deepcache"])]
    summary = {
        "ours_vs_package": statistics.median(per_round),
        "ours_vs_package_per_round": per_round,
        "ours_vs_package_wall": statistics.median(per_round_wall),
        "ours_vs_package_wall_per_round": per_round_wall,
        "psnr_ours_minus_package": ours["psnr"] - package["psnr"],
        "outputs_identical_to_package": bool(
            np.array_equal(images["fastdiff deepcache"], images["DeepCache package"])
        ),
    }
    summary["target_met"] = summary["ours_vs_package"] >= 1.0 and summary["psnr_ours_minus_package"] >= -0.5
    result = {
        "settings": {
            "model": f"tiny-sd {args.size}",
            "scheduler": f"dpm++2m {args.steps} steps",
            "guidance": args.guidance,
            "batch": 1,
            "threads": args.threads,
            "rounds": args.runs,
            "interval": args.interval,
            "branch": args.branch,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "configs": rows,
        "summary": summary,
    }

    header = f"{'config':<20} {'wall s':>7} {'speedup':>7} {'CPU s':>7} {'speedup':>7} {'PSNR dB':>8} {'SSIM':>7} "
    print(header + f"{'NFE':>4} {'UNet full CPU ms':>16} {'UNet cached CPU ms':>18}")
    for row in rows:
        cells = [
            f"{row['name']:<20}",
            f"{row['seconds_median']:>7.2f}",
            f"{row['speedup']:>7.2f}",
            f"{row['cpu_seconds_median']:>7.2f}",
            f"{row['cpu_speedup']:>7.2f}",
            f"{row['psnr']:>8.2f}" if row["psnr"] is not None else f"{'-':>8}",
            f"{row['ssim']:>7.4f}" if row["ssim"] is not None else f"{'-':>7}",
            f"{row['nfe']:>4}",
            f"{row['unet_full_cpu_ms']:>16.1f}",
            f"{row['unet_cached_cpu_ms']:>18.1f}" if row["unet_cached_cpu_ms"] is not None else f"{'-':>18}",
        ]
        print(" ".join(cells))
    print(
        f"ours vs package (median per-round ratio, package/ours): CPU {summary['ours_vs_package']:.3f}, "
        f"wall {summary['ours_vs_package_wall']:.3f}; "
        f"PSNR ours - package: {summary['psnr_ours_minus_package']:+.2f} dB; "
        f"identical outputs: {summary['outputs_identical_to_package']}; load {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_record(args.json, result, benchmark="deepcache_vs_package", indent=2)
    return result


if __name__ == "__main__":
    main()
