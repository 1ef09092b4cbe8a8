"""Every accelerator on the bench-size tiny builds of the flow (and video) families: speedup and PSNR vs plain.

Random weights: these figures show that each accelerator runs and what it saves on each family's shape;
quality claims come from digits-flow (benchmarks/flow_caching.py). Per family, one in-memory pipeline at 256 px,
its own sampler at ``--steps`` steps with its default guidance, one torch thread; every config gets one untimed
warm-up call, then ``--runs`` timed calls interleaved with the others. CPU seconds (process time, one thread) are
the cost; PSNR is against the plain config's images. A config refused at ``accelerate()`` is listed with the
reason.

    .venv/bin/python benchmarks/flow_families.py --runs 1          # every flow family
    .venv/bin/python benchmarks/flow_families.py --families tiny-flux,tiny-sd3
    .venv/bin/python benchmarks/flow_families.py --families video --out benchmarks/results/video_families.json

Writes ``benchmarks/results/flow_families.json`` (video: 9-frame 128 px clips, PSNR over every frame).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.tensors import pixels
from fastdiff.eval.bench import make_inputs, ratio_spread
from fastdiff.eval.fidelity import psnr
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline

RESULTS = Path(__file__).parent / "results"
FAMILIES = (
    "tiny-flux",
    "tiny-flux-schnell",
    "tiny-flux2",
    "tiny-flux2-klein",
    "tiny-sd3",
    "tiny-sana",
    "tiny-pixart-sigma",
    "tiny-qwen-image",
    "tiny-zimage",
)
VIDEO = ("tiny-wan", "tiny-cogvideox", "tiny-ltx", "tiny-hunyuan-video")
CONFIGS = {
    "plain": "",
    "flow-unipc": "scheduler(name=flow-unipc)",
    "first-block 0.1": "blockcache(mode=first-block,threshold=0.1)",
    "interval 2": "blockcache(mode=interval,interval=2)",
    "teacache 0.3": "blockcache(mode=teacache,threshold=0.3)",
    "forecast 2": "forecast(order=1,interval=2,warmup=2)",
    "cfg-interval 0-0.5": "cfg-interval(start=0.0,end=0.5)",
    "promptcache": "promptcache",
    "quantize int8": "quantize(mode=int8-dynamic)",
    "lowrank 0.9": "lowrank(energy=0.9)",
    "vae-tiling": "vae-tiling",
}


def call(fp, steps: int) -> tuple[np.ndarray, float, int]:
    kwargs = make_inputs(fp.pipe, 1)
    start = time.process_time()
    images = fp(**kwargs, num_inference_steps=steps, output_type="np", generator=torch.Generator().manual_seed(0))
    return pixels(images), time.process_time() - start, fp.context.nfe


def family(name: str, steps: int, runs: int, size: str = "bench", configs: tuple[str, ...] = ()) -> list[dict]:
    fp = FastPipeline(make_pipeline(name, size))
    fp.set_progress_bar_config(disable=True)
    rows, live = {}, []
    for label, spec in CONFIGS.items():
        if configs and label != "plain" and label not in configs:
            continue
        try:
            handle = fp.accelerate(spec) if spec else None
        except AcceleratorError as error:
            rows[label] = {"config": label, "spec": spec, "refused": str(error).split(": ", 1)[-1][:160]}
            continue
        images, _, nfe = call(fp, steps)  # warm-up (first calls, compile, quantization caches)
        rows[label] = {"config": label, "spec": spec, "cpu_seconds": [], "nfe": nfe}
        if handle is not None:
            handle.remove()
        live.append(label)
    for r in range(runs):
        for label in live[r % len(live) :] + live[: r % len(live)]:
            handle = fp.accelerate(CONFIGS[label]) if CONFIGS[label] else None
            images, seconds, _ = call(fp, steps)
            if handle is not None:
                handle.remove()
            rows[label]["cpu_seconds"].append(round(seconds, 2))
            rows[label].setdefault("images", images)
    plain = rows["plain"]
    for label in live:
        row = rows[label]
        row["cpu_median"] = float(np.median(row["cpu_seconds"]))
        row.update(ratio_spread(row["cpu_seconds"], plain["cpu_seconds"], "speedup", baseline=label == "plain"))
        row["psnr"] = None if label == "plain" else round(psnr(row.pop("images"), plain["images"]), 1)
    plain.pop("images", None)
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="flow", help="flow, video, or model names, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--size", default="bench", choices=["test", "bench"], help="test: a quick dry run")
    parser.add_argument("--out", default=str(RESULTS / "flow_families.json"))
    parser.add_argument(
        "--configs",
        default="",
        help=f"labels to run beside plain, comma-separated (default all: {', '.join(CONFIGS)})",
    )
    args = parser.parse_args()
    chosen = tuple(label for label in args.configs.split(",") if label)
    unknown = [label for label in chosen if label not in CONFIGS]
    if unknown:
        parser.error(f"unknown --configs {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    torch.set_num_threads(1)
    out = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "device": f"CPU, {os.cpu_count()} cores",
        "steps": args.steps,
        "runs": args.runs,
        "threads": 1,
        "size": args.size,
        "families": {},
    }
    names = {"flow": FAMILIES, "video": VIDEO}.get(args.families) or args.families.split(",")
    for name in names:
        out["families"][name] = family(name, args.steps, args.runs, args.size, chosen)
        write_record(Path(args.out), out, benchmark="flow_families", indent=1)
        for row in out["families"][name]:
            shown = (
                row.get("refused")
                or f"{row['cpu_median']:7.2f} s  x{row['speedup']:<6} nfe {row['nfe']:3d}  psnr {row['psnr']}"
            )
            print(f"{name:18s} {row['config']:20s} {shown}", flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
