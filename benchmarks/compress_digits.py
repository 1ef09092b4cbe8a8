"""Compression on the digits reference: prune(ratio=0.5) and lowrank(energy=0.9), each with and without
recovery fine-tuning, against the uncompressed model: parameters, MACs per image, seconds for 500 images,
speedup, accuracy, FD.

Run (about 30 minutes on one thread)::

    .venv/bin/python benchmarks/compress_digits.py --model .fastdiff-cache/digits

The compressed models are built with ``compress_model`` into ``--work`` (reused when already there, unless
``--rebuild``). Sampling: 500 images (labels 0..9 cycling), ``--scheduler`` (default dpm++2m, 20 steps), one
thread; each timed run calls every model once, in turn, so the ratios share the machine's load. Writes
``benchmarks/results/compress_digits.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.compress.lowrank import count_params_macs
from fastdiff.compress.recover import MANIFEST, capture_inputs, compress_model, load_compressed
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs

# name -> (specs, recovery steps, learning rate): the pruned model is 28% of the original and needs more
# (and faster) training than the low-rank one, which starts close to the original.
COMPRESSIONS = {
    "prune": ("prune(ratio=0.5)", 600, 2e-3),
    "lowrank": ("lowrank(energy=0.9,targets=all)", 200, 5e-4),
}


def build(model: Path, work: Path, args) -> tuple[dict[str, Path], dict]:
    dirs, settings = {}, {}
    for name, (spec, steps, lr) in COMPRESSIONS.items():
        steps = steps if args.recover_steps is None else args.recover_steps
        settings[name] = {"specs": spec, "recover_steps": steps, "lr": lr, "batch": args.batch}
        for n in (0, steps):
            label = f"{name}+recover{n}" if n else f"{name} (no recovery)"
            out = work / (f"{name}-{n}-lr{lr:g}-b{args.batch}" if n else f"{name}-0")
            if args.rebuild or not (out / MANIFEST).is_file():
                compress_model(model, out, spec, recover_steps=n, batch=args.batch, lr=lr, resume=True)
            dirs[label] = out
    return dirs, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=".fastdiff-cache/digits")
    parser.add_argument("--work", default="/tmp/fastdiff-compress-digits")
    parser.add_argument("--recover-steps", type=int, default=None, help="override the steps of every method")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--scheduler", default="scheduler(name=dpm++2m,steps=20)")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/compress_digits.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, work = Path(args.model), Path(args.work)
    started = time.perf_counter()
    dirs, settings = build(model, work, args)
    build_seconds = time.perf_counter() - started

    pipes = {"original": FastPipeline.from_pretrained(model)}
    pipes.update({label: load_compressed(d) for label, d in dirs.items()})
    rows = {}
    for label, fp in pipes.items():
        fp.pipe.set_progress_bar_config(disable=True)
        fp.accelerate(args.scheduler)
        params, macs = count_params_macs(fp.denoiser, capture_inputs(fp, batch=1))
        manifest = json.loads((dirs[label] / MANIFEST).read_text()) if label in dirs else {}
        rows[label] = {"params": params, "macs_per_image": macs, "seconds": [],
                       "recover": manifest.get("recover")}  # fmt: skip
    call = dict(make_inputs(pipes["original"].pipe, args.images), output_type="np")
    for fp in pipes.values():  # warm-up: first calls at a new batch shape pay one-time costs
        fp(**dict(call, num_inference_steps=2), generator=torch.Generator().manual_seed(0))
    load = os.getloadavg()[0]
    outputs = {}
    for _ in range(args.runs):
        for label, fp in pipes.items():
            start = time.perf_counter()
            outputs[label] = fp(**call, generator=torch.Generator().manual_seed(0)).images
            rows[label]["seconds"].append(time.perf_counter() - start)
    for label, fp in pipes.items():
        rows[label].update(quality_for(fp.pipe)(fp.pipe, call, outputs[label], 0))
    base = rows["original"]
    for row in rows.values():
        row["seconds_median"] = statistics.median(row["seconds"])
        row["speedup"] = base["seconds_median"] / row["seconds_median"]
        row["params_ratio"] = row["params"] / base["params"]
        row["macs_ratio"] = row["macs_per_image"] / base["macs_per_image"]
        row["accuracy_drop_points"] = 100 * (base["accuracy"] - row["accuracy"])
    result = {
        "model": str(model), "images": args.images, "sampler": args.scheduler, "threads": 1, "runs": args.runs,
        "build_seconds": round(build_seconds, 1), "load_average_1min_at_timing": load,
        "compressions": settings, "rows": rows,
    }  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(
        f"{'model':28} {'params':>8} {'MACs/img':>10} {'s':>7} {'speedup':>7} {'acc':>6} {'fd':>7} (load {load:.1f})"
    )
    for label, r in rows.items():
        print(f"{label:28} {r['params_ratio']:8.1%} {r['macs_ratio']:10.1%} {r['seconds_median']:7.1f} "
              f"{r['speedup']:7.2f} {r['accuracy']:6.3f} {r['fd']:7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
