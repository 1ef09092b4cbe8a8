"""Compression on the digits reference: prune(ratio=0.5) and lowrank(energy=0.9), each with and without
recovery fine-tuning, against the uncompressed model: parameters, MACs per image, seconds for 500 images,
speedup, accuracy, FD.

Run (on one thread: about 10 minutes once the models are built; building them is recovery training, hours
on 2 CPU cores or about 10 minutes on one GPU with ``benchmarks/recover_on_gpu.sh``)::

    .venv/bin/python benchmarks/compress_digits.py --model .fastdiff-cache/digits --runs 3

The compressed models are built with ``compress_model`` into ``--work`` (reused when already there, unless
``--rebuild``). Sampling: 500 images (labels 0..9 cycling), ``--scheduler`` (default dpm++2m, 20 steps), one
thread; each timed run calls every model once, in turn, so the ratios share the machine's load; wall and
process CPU seconds are both recorded (CPU time is the steadier on a shared machine). Writes
``benchmarks/results/compress_digits.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.compress.lowrank import count_params_macs
from fastdiff.compress.recover import MANIFEST, capture_inputs, compress_model, load_compressed
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs, spread
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits

# name -> (specs, recovery steps, learning rate, batch): the pruned model is 28% of the original and needs
# much more (and faster) training than the low-rank one, which starts close to the original.
COMPRESSIONS = {
    "prune": ("prune(ratio=0.5)", 10000, 2e-3, 128),
    "lowrank": ("lowrank(energy=0.9,targets=all)", 1000, 5e-4, 128),
}


def build(model: Path, work: Path, args) -> tuple[dict[str, Path], dict]:
    dirs, settings = {}, {}
    for name, (spec, steps, lr, batch) in COMPRESSIONS.items():
        steps = steps if args.recover_steps is None else args.recover_steps
        batch = batch if args.batch is None else args.batch
        settings[name] = {"specs": spec, "recover_steps": steps, "lr": lr, "batch": batch}
        for n in (0, steps):
            label = f"{name}+recover{n}" if n else f"{name} (no recovery)"
            out = work / (f"{name}-{n}-lr{lr:g}-b{batch}" if n else f"{name}-0")
            if args.rebuild or not (out / MANIFEST).is_file():
                compress_model(model, out, spec, recover_steps=n, batch=batch, lr=lr, resume=True)
            dirs[label] = out
    return dirs, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=".fastdiff-cache/digits")
    parser.add_argument("--work", default="/tmp/fastdiff-compress-digits")
    parser.add_argument("--recover-steps", type=int, default=None, help="override the steps of every method")
    parser.add_argument("--batch", type=int, default=None, help="override the recovery batch of every method")
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the compressed models and stop "
        "(recovery uses a GPU when there is one; see benchmarks/recover_on_gpu.sh)",
    )
    parser.add_argument("--scheduler", default="scheduler(name=dpm++2m,steps=20)")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/compress_digits.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, work = ensure_digits(args.model), Path(args.work)
    started = time.perf_counter()
    dirs, settings = build(model, work, args)
    build_seconds = time.perf_counter() - started
    if args.build_only:
        print(f"built {sorted(map(str, dirs.values()))} in {build_seconds:.0f} s")
        return

    pipes = {"original": FastPipeline.from_pretrained(model)}
    pipes.update({label: load_compressed(d) for label, d in dirs.items()})
    rows = {}
    for label, fp in pipes.items():
        fp.pipe.set_progress_bar_config(disable=True)
        fp.accelerate(args.scheduler)
        params, macs = count_params_macs(fp.denoiser, capture_inputs(fp, batch=1))
        manifest = json.loads((dirs[label] / MANIFEST).read_text()) if label in dirs else {}
        rows[label] = {
            "params": params,
            "macs_per_image": macs,
            "seconds": [],
            "cpu_seconds": [],
            "recover": manifest.get("recover"),
        }
    call = dict(make_inputs(pipes["original"].pipe, args.images), output_type="np")
    for fp in pipes.values():  # warm-up: first calls at a new batch shape pay one-time costs
        fp(**dict(call, num_inference_steps=2), generator=torch.Generator().manual_seed(0))
    load = os.getloadavg()[0]
    outputs = {}
    for _ in range(args.runs):
        for label, fp in pipes.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            outputs[label] = fp(**call, generator=torch.Generator().manual_seed(0)).images
            rows[label]["seconds"].append(time.perf_counter() - start)
            rows[label]["cpu_seconds"].append(time.process_time() - start_cpu)
    for label, fp in pipes.items():
        rows[label].update(quality_for(fp.pipe)(fp.pipe, call, outputs[label], 0))
    base = rows["original"]
    for row in rows.values():
        row.update(spread(row, base))  # medians, speedups and their spread over the rounds
        row["params_ratio"] = row["params"] / base["params"]
        row["macs_ratio"] = row["macs_per_image"] / base["macs_per_image"]
        row["accuracy_drop_points"] = 100 * (base["accuracy"] - row["accuracy"])
    result = {
        "model": str(model),
        "images": args.images,
        "sampler": args.scheduler,
        "threads": 1,
        "runs": args.runs,
        "build_seconds": round(build_seconds, 1),
        "load_average_1min_at_timing": load,
        "compressions": settings,
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="compress_digits", indent=2)
    print(
        f"{'model':28} {'params':>8} {'MACs/img':>10} {'s':>7} {'speedup':>7} {'cpu':>5} {'acc':>6} {'fd':>7} (load {load:.1f})"
    )
    for label, r in rows.items():
        print(
            f"{label:28} {r['params_ratio']:8.1%} {r['macs_ratio']:10.1%} {r['seconds_median']:7.1f} "
            f"{r['speedup']:7.2f} {r['cpu_speedup']:5.2f} {r['accuracy']:6.3f} {r['fd']:7.2f}"
        )


if __name__ == "__main__":
    main()
