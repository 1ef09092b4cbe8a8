"""The Stable-Diffusion-shaped accelerators on digits-sd, with accuracy and FD (not PSNR on random weights).

Run (heavy: one thread, under the shared lock; about 10 minutes; also a guidance-2 baseline)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/digits_sd.py   # benchmarks/results/digits_sd.json

digits-sd is a real ``StableDiffusionPipeline`` (VAE, CLIP text encoder, UNet2DConditionModel with
cross-attention) trained on the digits (``fastdiff.zoo.reference_sd``); ``run_bench`` scores each config's 500
images (bench prompts naming each digit 50 times) with the digits classifier and FD, side by side in one run:
one untimed warm-up, then ``--runs`` timed calls of the whole batch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastdiff.eval.bench import format_table, run_bench
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import install

RESULTS = Path(__file__).resolve().parent / "results"
DPM = "scheduler(name=dpm++2m,steps=20)"
CONFIGS = [
    ("dpm++2m 20", DPM),
    ("tome 0.5", f"{DPM};tome(ratio=0.5)"),
    ("deepcache 3", f"{DPM};deepcache(interval=3,branch=0)"),
    ("promptcache", f"{DPM};promptcache"),
    ("cfg-interval 0.2-0.8", f"{DPM};cfg-interval(start=0.2,end=0.8)"),
    ("cfg-interval 0-0.5", f"{DPM};cfg-interval(start=0.0,end=0.5)"),
    ("forecast 1/3", f"{DPM};forecast(order=1,interval=3)"),
    ("dpm++2m 10", "scheduler(name=dpm++2m,steps=10)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        type=Path,
        default=Path(".fastdiff-cache/digits-sd"),
        help="a digits-sd build (the shipped one is installed there if absent)",
    )
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "digits_sd.json")
    args = parser.parse_args()
    if not (args.model / "model_index.json").is_file():
        install(args.model, "digits-sd")
    result = run_bench(
        args.model,
        CONFIGS,
        steps=None,
        runs=args.runs,
        threads=args.threads,
        batch=args.batch,
        guidance=args.guidance,
        json_path=args.out,
    )
    print(format_table(result), flush=True)
    low = run_bench(
        args.model,
        [("dpm++2m 20, guidance 2", DPM)],
        steps=None,
        runs=args.runs,
        threads=args.threads,
        batch=args.batch,
        guidance=2.0,
    )
    result["guidance_2"] = low["configs"][0]
    result["model_report"] = json.loads((args.model / "eval" / "report.json").read_text())
    write_record(args.out, result, benchmark="digits_sd", indent=2)
    print(format_table(low))


if __name__ == "__main__":
    main()
