"""Caching on other denoisers: ``blockcache`` on tiny-dit, ``deepcache`` on tiny-sdxl and the digits reference.

Per model, every config runs on one pipeline with the same inputs and seed (dpm++2m 20 steps, one thread,
the pipeline's default batch and guidance), interleaved: one warm-up run each (images, NFE, how many passes
reached the deepest block), then ``--runs`` rounds of one timed run per config in a rotating order, so load
changes on the shared machine hit every config alike. Wall and process CPU time are both recorded; with one
thread CPU time is the compute cost and far less disturbed by other processes, so ``cpu_speedup`` is the
figure to read. PSNR/SSIM are against the uncached first config; the digits model adds accuracy/FD.

Command::

    .venv/bin/python benchmarks/cache_dit.py --runs 5 --threads 1            # all models
    .venv/bin/python benchmarks/cache_dit.py --models tiny-dit --runs 5      # one model

Single-run equivalent with the CLI (wall time only, configs one after another)::

    fastdiff bench tiny-dit --threads 1 --runs 3 --config base="scheduler(name=dpm++2m,steps=20)" \\
        --config fbc="scheduler(name=dpm++2m,steps=20);blockcache(mode=first-block,threshold=0.05)"

Writes ``benchmarks/results/cache_<model>.json``. The digits model is ``.fastdiff-cache/digits``: the shipped
reference is installed there (hash-checked) when it holds no build yet; it runs at most 3 rounds (500 images a
call), the fewest that give each ratio a range.
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
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs, ratio_spread
from fastdiff.eval.fidelity import psnr, ssim
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits
from fastdiff.zoo.tiny import make_pipeline

RESULTS = Path(__file__).parent / "results"
DIGITS = Path(__file__).parents[1] / ".fastdiff-cache" / "digits"
BASE = "scheduler(name=dpm++2m,steps=20)"

CONFIGS = {
    "tiny-dit": [
        ("base", BASE),
        ("fbc-0.05", f"{BASE};blockcache(mode=first-block,threshold=0.05)"),
        ("fbc-0.1", f"{BASE};blockcache(mode=first-block,threshold=0.1)"),
        ("fbc-0.2", f"{BASE};blockcache(mode=first-block,threshold=0.2)"),
        ("interval-2", f"{BASE};blockcache(mode=interval,interval=2)"),
        ("interval-3", f"{BASE};blockcache(mode=interval,interval=3)"),
    ],
    "tiny-sdxl": [
        ("base", BASE),
        ("dc-3-b0", f"{BASE};deepcache(interval=3,branch=0)"),
        ("dc-3-b0-nonuniform", f"{BASE};deepcache(interval=3,branch=0,schedule=nonuniform)"),
        ("dc-3-b3", f"{BASE};deepcache(interval=3,branch=3)"),
        ("dc-2-b0", f"{BASE};deepcache(interval=2,branch=0)"),
    ],
    # The digits UNet2DModel: 3 down blocks (16x16, 8x8, 4x4) of one layer each, 6 skip branches. Branch 1
    # keeps every 16x16 layer (conv_in, down 0, the last up block) and caches everything at 8x8 and below;
    # branch 3 also keeps the first 8x8 layer; branch 0 keeps only one 16x16 up layer.
    "digits": [
        ("base", BASE),
        ("dc-3-b1", f"{BASE};deepcache(interval=3,branch=1)"),
        ("dc-3-b3", f"{BASE};deepcache(interval=3,branch=3)"),
        ("dc-3-b0", f"{BASE};deepcache(interval=3,branch=0)"),
        ("dc-3-b1-nonuniform", f"{BASE};deepcache(interval=3,branch=1,schedule=nonuniform)"),
        ("dc-2-b1", f"{BASE};deepcache(interval=2,branch=1)"),
    ],
}


def load(name: str) -> FastPipeline:
    fp = (
        FastPipeline.from_pretrained(ensure_digits(DIGITS))
        if name == "digits"
        else FastPipeline(make_pipeline(name, "bench"))
    )
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def deepest_leaf(model) -> torch.nn.Module:
    """A leaf that only runs when the deepest part of the denoiser runs (skipped work never reaches it)."""
    if hasattr(model, "transformer_blocks"):
        return model.transformer_blocks[-1].attn1.to_q
    block = model.mid_block if model.mid_block is not None else model.down_blocks[-1]
    return block.resnets[0].conv1


def measure(fp: FastPipeline, configs: list[tuple[str, str]], runs: int, seed: int = 0) -> list[dict]:
    call = dict(make_inputs(fp.pipe), output_type="np")

    def once():
        return np.asarray(fp(**call, generator=torch.Generator().manual_seed(seed)).images)

    rows, images = [], {}
    leaf_calls = []
    counter = deepest_leaf(fp.denoiser).register_forward_hook(lambda *_: leaf_calls.append(1))
    for name, specs in configs:  # warm-up: images, NFE, deep passes
        handle = fp.accelerate(specs)
        leaf_calls.clear()
        images[name] = once()
        rows.append({"name": name, "specs": specs, "nfe": fp.context.nfe, "deep_passes": len(leaf_calls)})
        handle.remove()
    counter.remove()
    wall, cpu = {n: [] for n, _ in configs}, {n: [] for n, _ in configs}
    for r in range(runs):
        for name, specs in configs[r % len(configs) :] + configs[: r % len(configs)]:
            handle = fp.accelerate(specs)
            start, start_cpu = time.perf_counter(), time.process_time()
            once()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            handle.remove()
    base = configs[0][0]
    evaluator = quality_for(fp.pipe)
    for row in rows:
        name = row["name"]
        row.update(
            seconds_median=statistics.median(wall[name]),
            seconds=wall[name],
            **ratio_spread(wall[name], wall[base], "speedup", baseline=name == base),
            cpu_seconds_median=statistics.median(cpu[name]),
            cpu_seconds=cpu[name],
            **ratio_spread(cpu[name], cpu[base], "cpu_speedup", baseline=name == base),
            psnr=None if name == base else psnr(images[name], images[base]),
            ssim=None if name == base else ssim(images[name], images[base]),
        )
        if evaluator is not None:
            row.update(evaluator(fp.pipe, call, images[name], seed))
    return rows


def table(rows: list[dict]) -> str:
    keys = ["name", "seconds_median", "speedup", "cpu_seconds_median", "cpu_speedup", "nfe", "deep_passes"]
    keys += ["psnr", "ssim"] + [k for k in ("accuracy", "fd", "fd_floor") if k in rows[0]]
    cells = [
        [k] + [f"{r[k]:.4g}" if isinstance(r[k], float) else ("-" if r[k] is None else str(r[k])) for r in rows]
        for k in keys
    ]
    widths = [max(len(c) for c in column) for column in cells]
    return "\n".join("  ".join(col[i].ljust(w) for col, w in zip(cells, widths)) for i in range(len(rows) + 1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in args.models:
        before = os.getloadavg()
        runs = min(args.runs, 3) if name == "digits" else args.runs  # 500 images per call; 3: a ratio's range
        rows = measure(load(name), CONFIGS[name], runs)
        result = {
            "model": name if name == "digits" else f"{name} bench",
            "settings": {"steps": 20, "scheduler": "dpm++2m", "threads": args.threads, "rounds": runs},
            "loadavg": [before, os.getloadavg()],
            "configs": rows,
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        write_record(RESULTS / f"cache_{name}.json", result, benchmark="cache_dit", indent=2)
        print(f"\n{name}  (loadavg before {before[0]:.1f}, after {os.getloadavg()[0]:.1f})")
        print(table(rows))


if __name__ == "__main__":
    main()
