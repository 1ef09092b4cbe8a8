"""Stage pipelining: images per second over a stream of requests, pipelined vs one after another, same run.

Run alone on the 2-core machine, under the shared lock::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/stage_pipeline.py   # results/stage_pipeline.json

Model: tiny-sd at bench size. For each setting (sampler steps, guidance scale, image size):

- ``split``: seconds per request of each stage (text encoder / denoiser / VAE decoder) run one after another
  in this process (1 thread), median over ``--split-requests`` requests after one warm-up request, and the
  Amdahl bound on the pipelined speedup: total / slowest process's share (denoiser alone, or text + VAE);
- ``sequential``: the ``--requests`` requests through ``FastPipeline`` one after another, 1 process x 1 thread;
- ``pipelined``: the same requests through ``StagePipeline`` on 2 (and 3) processes x 1 thread each;
  ``--layouts 3:2`` also runs 3 processes with 2 denoiser replicas (text + VAE on the third, nearly idle one).

Both get one untimed warm-up request; worker start-up is not timed (it is reported). Requests differ in
prompt and seed. The images of the two runs are compared (max absolute difference, pixels in [0, 1]).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff import FastPipeline
from fastdiff.eval.record import write_record
from fastdiff.parallel.launch import retain_freed_memory
from fastdiff.serving.stage_workers import STAGE_FUNCTIONS, STAGES
from fastdiff.serving.stages import StagePipeline
from fastdiff.zoo import build

RESULTS = Path(__file__).resolve().parent / "results"
# name: (steps, guidance scale, image size)
SETTINGS = {
    "dpm++2m 20, guidance 7.5, 256px": (20, 7.5, 256),
    "dpm++2m 4, no guidance, 256px": (4, 1.0, 256),
    "dpm++2m 2, no guidance, 256px": (2, 1.0, 256),
    "dpm++2m 4, no guidance, 512px": (4, 1.0, 512),
    "dpm++2m 20, guidance 7.5, 512px": (20, 7.5, 512),
}
SUBJECTS = ("a red fox", "a blue car", "a green tree", "a yellow house", "a white cat", "an old boat")


def requests(count: int, guidance: float, size: int, offset: int = 0) -> list[dict]:
    return [
        {
            "prompt": [f"{SUBJECTS[i % len(SUBJECTS)]}, picture {i}"],
            "guidance_scale": guidance,
            "height": size,
            "width": size,
            "output_type": "np",
            "generator": torch.Generator().manual_seed(i),
        }
        for i in range(offset, offset + count)
    ]


def split(fp, guidance: float, size: int, count: int) -> dict:
    """Median seconds per request of each stage, run one after another in this process."""
    times = {s: [] for s in STAGES}
    for n, request in enumerate(requests(count + 1, guidance, size)):
        item = request
        for stage in STAGES:
            start = time.perf_counter()
            item = STAGE_FUNCTIONS[stage](fp, item)
            if n:  # the first request warms up
                times[stage].append(time.perf_counter() - start)
    median = {s: statistics.median(t) for s, t in times.items()}
    total = sum(median.values())
    bound_2 = total / max(median["denoise"], median["text"] + median["decode"])
    return {
        "seconds": median,
        "share": {s: median[s] / total for s in STAGES},
        "amdahl_bound_2_processes": bound_2,
        "amdahl_bound_3_processes": total / max(median.values()),
    }


def sequential(fp, count: int, guidance: float, size: int) -> tuple[float, list]:
    fp(**requests(1, guidance, size, offset=10_000)[0])  # warm-up
    batch = requests(count, guidance, size)  # fresh generators for each run
    start = time.perf_counter()
    images = [fp(**r).images for r in batch]
    return time.perf_counter() - start, images


def pipelined(
    model, specs: str, devices: int, count: int, guidance: float, size: int, denoisers: int = 1
) -> tuple[float, float, list]:
    start = time.perf_counter()
    with StagePipeline(model, accelerators=specs, devices=devices, queue_size=2, denoisers=denoisers) as sp:
        startup = time.perf_counter() - start
        sp.map(requests(1, guidance, size, offset=10_000))  # warm-up
        batch = requests(count, guidance, size)
        start = time.perf_counter()
        images = sp.map(batch)
        seconds = time.perf_counter() - start
    return seconds, startup, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS)[:3], choices=list(SETTINGS))
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument(
        "--layouts", nargs="+", default=["2", "3"], help="DEVICES or DEVICES:DENOISERS (3:2: two denoiser replicas)"
    )
    parser.add_argument("--split-requests", type=int, default=3)
    parser.add_argument("--split-only", action="store_true", help="measure the time split only")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    parser.add_argument("--out", type=Path, default=RESULTS / "stage_pipeline.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    retain_freed_memory()  # the sequential runs here, with the same malloc settings as launch()'s workers
    model = build("tiny-sd", args.cache / "tiny-sd-bench", size="bench")
    out = json.loads(args.out.read_text()) if args.out.is_file() else {}
    out.setdefault("settings", {})
    out["machine"] = "2-core CPU, 1 torch thread per process; startup (spawn, load, apply) not timed"
    for name in args.settings:
        steps, guidance, size = SETTINGS[name]
        specs = f"scheduler(name=dpm++2m,steps={steps})"
        fp = FastPipeline.from_pretrained(model, accelerators=specs)
        fp.pipe.set_progress_bar_config(disable=True)
        result = {
            "specs": specs,
            "guidance_scale": guidance,
            "size": size,
            "split": split(fp, guidance, size, args.split_requests),
        }
        print(name, json.dumps(result["split"]), flush=True)
        if not args.split_only:
            seconds, reference = sequential(fp, args.requests, guidance, size)
            result["requests"] = args.requests
            result["sequential"] = {"seconds": seconds, "images_per_s": args.requests / seconds}
            for name_of_layout in args.layouts:
                devices, _, denoisers = name_of_layout.partition(":")
                devices, denoisers = int(devices), int(denoisers or 1)
                par_seconds, startup, images = pipelined(
                    model, specs, devices, args.requests, guidance, size, denoisers
                )
                diff = max(float(np.abs(a - b).max()) for a, b in zip(images, reference))
                key = f"pipelined_{devices}" + (f"_{denoisers}_denoisers" if denoisers > 1 else "")
                result[key] = {
                    "seconds": par_seconds,
                    "startup_seconds": startup,
                    "images_per_s": args.requests / par_seconds,
                    "speedup": seconds / par_seconds,
                    "runs": 1,
                    "max_abs_difference": diff,
                }
                print(name, key, json.dumps(result[key]), flush=True)
        result["load_average_after"] = os.getloadavg()  # other jobs on the machine would show here
        out["settings"][name] = {**out["settings"].get(name, {}), **result}
        args.out.parent.mkdir(exist_ok=True)
        write_record(args.out, out, benchmark="stage_pipeline", indent=2)


if __name__ == "__main__":
    main()
