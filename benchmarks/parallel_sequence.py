"""parallel(mode=ulysses): 2 processes x 1 thread vs 1 process x 1 thread on a video transformer, same seed.

Run alone on the 2-core machine (both cores are needed), under the shared lock::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/parallel_sequence.py   # results/parallel_sequence.json

Model: the tiny Wan build at bench size (random weights; what is measured is the split of the work, not quality),
its own sampler, guidance off (one denoiser call per step), at each ``--clips`` setting (frames x side); or, with
``--model DIR`` (a moving-digits build), that model at its own clip size, bench prompt and guidance, timed
for the denoising loop alone (``output_type="latent"``: what sequence parallelism splits) and for the whole call
(``np``: with the VAE decode, which every rank runs whole and which dominates this tiny transformer's call). Each
setting runs in freshly launched workers (one for the baseline, two for Ulysses): one untimed warm-up call, then
one timed call; ``--runs`` rounds alternate the two; the speedup is the ratio of the median wall times. The outputs
of the two settings are compared (max absolute difference; pixels in [0, 1], or latents).
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import numpy as np

from fastdiff.eval.bench import ratio_spread
from fastdiff.eval.record import write_record
from fastdiff.parallel.launch import launch
from fastdiff.parallel.run import generate
from fastdiff.zoo import build

RESULTS = Path(__file__).resolve().parent / "results"
SPEC = "parallel(mode=ulysses,devices=2)"


def tokens(frames: int, side: int, temporal: int = 4, spatial: int = 8) -> int:
    """Wan's sequence: latent frames (first frame alone) x (side / spatial / 2) ** 2 patches."""
    return ((frames - 1) // temporal + 1) * (side // spatial // 2) ** 2


def measure(model, call: dict, runs: int, output_type: str) -> dict:
    single, two, diffs = [], [], []
    for _ in range(runs):  # alternate, so load changes hit both settings
        one = launch(generate, 1, str(model), [""], call, 0, True, output_type, timeout_s=1800)[""]
        par = launch(generate, 2, str(model), [SPEC], call, 0, True, output_type, timeout_s=1800)[SPEC]
        single.append(round(one["seconds"], 2))
        two.append(round(par["seconds"], 2))
        diffs.append(float(np.abs(np.asarray(one["images"]) - np.asarray(par["images"])).max()))
    return {
        "single_seconds": single,
        "parallel_seconds": two,
        **ratio_spread(two, single, "speedup"),
        "max_abs_difference": max(diffs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--clips", default="9x128,33x256,65x256", help="FRAMESxSIDE,...")
    parser.add_argument("--outputs", default="latent,np", help="latent: the denoising loop alone; np: the whole call")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    parser.add_argument("--model", type=Path, default=None, help="a moving-digits build (default: tiny-wan)")
    parser.add_argument("--batch", type=int, default=1, help="clips per call")
    parser.add_argument("--guidance", type=float, default=None, help="with --model: default the model's own")
    parser.add_argument("--out", type=Path, default=RESULTS / "parallel_sequence.json")
    args = parser.parse_args()
    model = args.model or build("tiny-wan", args.cache / "tiny-wan-bench", size="bench")
    prompt, guidance, scales = "a red circle", 1.0, (4, 8)
    if args.model:
        settings = json.loads((args.model / "eval" / "prompts.json").read_text())
        prompt, guidance, clip = settings["bench_prompts"][0], settings["guidance"], settings["call"]
        guidance = guidance if args.guidance is None else args.guidance
        args.clips = f"{clip['num_frames']}x{clip['height']}"
        vae = json.loads((args.model / "vae" / "config.json").read_text())
        scales = (vae["scale_factor_temporal"], vae["scale_factor_spatial"])
    rows = []
    for clip in args.clips.split(","):
        frames, side = map(int, clip.split("x"))
        call = {
            "prompt": [prompt] * args.batch,
            "num_inference_steps": args.steps,
            "guidance_scale": guidance,
            "num_frames": frames,
            "height": side,
            "width": side,
        }
        for output in args.outputs.split(","):
            row = {
                "frames": frames,
                "side": side,
                "tokens": tokens(frames, side, *scales),
                "output_type": output,
                **measure(model, call, args.runs, output),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    name = f"moving-digits ({args.model.name})" if args.model else "tiny-wan (bench build, random weights)"
    result = {
        "model": name,
        "spec": SPEC,
        "steps": args.steps,
        "guidance": guidance,
        "batch": args.batch,
        "runs": args.runs,
        "rows": rows,
        "date": str(date.today()),
        "device": "2-core CPU; 2 processes x 1 thread vs 1 process x 1 thread",
        "command": f"python benchmarks/parallel_sequence.py --runs {args.runs} --steps {args.steps} --clips {args.clips} --outputs {args.outputs}"
        + (f" --model MODEL --batch {args.batch} --guidance {guidance:g}" if args.model else ""),
    }
    RESULTS.mkdir(exist_ok=True)
    write_record(args.out, result, benchmark="parallel_sequence", indent=1)


if __name__ == "__main__":
    main()
