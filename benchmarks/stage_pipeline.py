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
prompt and seed. ``--runs`` rounds alternate the two (sequential, then each layout), so a drift of the machine
falls on both; the speedup is the ratio of the medians, with the spread of the ratios within a round. The
images are compared with the sequential ones (max absolute difference, pixels in [0, 1]).
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
from fastdiff.eval.bench import ratio_spread
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


def layout_key(layout: str) -> tuple[str, int, int]:
    devices, _, denoisers = layout.partition(":")
    devices, denoisers = int(devices), int(denoisers or 1)
    return f"pipelined_{devices}" + (f"_{denoisers}_denoisers" if denoisers > 1 else ""), devices, denoisers


def compare(fp, model, specs: str, args, guidance: float, size: int) -> dict:
    """``--runs`` rounds, each the requests one after another, then through every layout: medians and the
    speedups' spread (ratios within a round)."""
    sequential_s: list[float] = []
    piped: dict[str, dict] = {}
    for _ in range(args.runs):
        seconds, reference = sequential(fp, args.requests, guidance, size)
        sequential_s.append(seconds)
        for layout in args.layouts:
            key, devices, denoisers = layout_key(layout)
            par_seconds, startup, images = pipelined(model, specs, devices, args.requests, guidance, size, denoisers)
            row = piped.setdefault(key, {"seconds_all": [], "startup_seconds_all": [], "max_abs_difference": 0.0})
            row["seconds_all"].append(par_seconds)
            row["startup_seconds_all"].append(startup)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(images, reference))
            row["max_abs_difference"] = max(row["max_abs_difference"], diff)
            print(key, f"{seconds:.1f} s one after another, {par_seconds:.1f} s pipelined", flush=True)
    result: dict = {
        "requests": args.requests,
        "runs": args.runs,
        "sequential": {
            "seconds": statistics.median(sequential_s),
            "seconds_all": sequential_s,
            "images_per_s": args.requests / statistics.median(sequential_s),
        },
    }
    for key, row in piped.items():
        median = statistics.median(row["seconds_all"])
        result[key] = {
            "seconds": median,
            **row,
            "images_per_s": args.requests / median,
            **ratio_spread(row["seconds_all"], sequential_s, "speedup"),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS)[:3], choices=list(SETTINGS))
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument(
        "--layouts", nargs="+", default=["2", "3"], help="DEVICES or DEVICES:DENOISERS (3:2: two denoiser replicas)"
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds of sequential, then every layout")
    parser.add_argument("--split-requests", type=int, default=3)
    parser.add_argument("--split-only", action="store_true", help="measure the time split only")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    parser.add_argument("--out", type=Path, default=RESULTS / "stage_pipeline.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    retain_freed_memory()  # the sequential runs here, with the same malloc settings as launch()'s workers
    model = build("tiny-sd", args.cache / "tiny-sd-bench", size="bench")
    out: dict = {
        "machine": "2-core CPU, 1 torch thread per process; startup (spawn, load, apply) not timed",
        "settings": {},
    }
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
            result.update(compare(fp, model, specs, args, guidance, size))
        result["load_average_after"] = os.getloadavg()  # other jobs on the machine would show here
        out["settings"][name] = result
        args.out.parent.mkdir(exist_ok=True)
        write_record(args.out, out, benchmark="stage_pipeline", indent=2)  # after each setting: nothing lost


if __name__ == "__main__":
    main()
