"""parallel(mode=cfg): 2 processes x 1 thread vs 1 process x 1 thread, dpm++2m 20, same seed, side by side.

Run alone on the 2-core machine (both cores are needed), under the shared lock::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/parallel_cfg.py   # results/parallel_cfg.json

Models: tiny-sd (bench size, guidance 7.5, 2 prompts), the digits reference (guidance 2, 100 images) and, with
``--models digits-flow --flow-model DIR``, digits-flow (flow Euler 28, guidance 4, 100 images); with
``--models moving-digits --video-model DIR``, moving-digits (Wan's UniPC 50, guidance 5, 50 clips; Wan calls its
transformer once per branch, cfg_separate.py).
Each setting runs in freshly launched worker processes (one for the baseline, two for parallel): one untimed
warm-up call, then ``--runs`` timed calls alternating baseline and parallel; the speedup is the ratio of the
median wall times. The images of the two settings are compared (max absolute difference, pixels in [0, 1]).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fastdiff.eval.bench import make_inputs, ratio_spread
from fastdiff.eval.record import write_record
from fastdiff.parallel.launch import launch
from fastdiff.parallel.run import generate
from fastdiff.zoo import build
from fastdiff.zoo.shipped import ensure_digits

RESULTS = Path(__file__).resolve().parent / "results"
# the others: dpm++2m 20; moving-digits: Wan's own UniPC at its 50 steps
SAMPLERS = {"digits-flow": "scheduler(name=flow-euler,steps=28)", "moving-digits": ""}
CALLS = {"tiny-sd": (2, 7.5), "digits": (100, 2.0), "digits-flow": (100, 4.0), "moving-digits": (50, 5.0)}


def measure(model, call: dict, runs: int, sampler: str = "scheduler(name=dpm++2m,steps=20)") -> dict:
    single, two, diffs = [], [], []
    for _ in range(runs):  # alternate, so load changes hit both settings
        one = launch(generate, 1, str(model), [sampler], call, 0, True)[sampler]
        par_spec = ";".join(s for s in (sampler, "parallel(mode=cfg,devices=2)") if s)
        par = launch(generate, 2, str(model), [par_spec], call, 0, True)[par_spec]
        single.append(one["seconds"])
        two.append(par["seconds"])
        diffs.append(float(np.abs(one["images"] - par["images"]).max()))
    return {
        "single_seconds": single,
        "parallel_seconds": two,
        **ratio_spread(two, single, "speedup"),
        "max_abs_difference": max(diffs),
        "images": int(one["images"].shape[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    parser.add_argument("--models", default="tiny-sd,digits", help="of tiny-sd, digits, digits-flow, moving-digits")
    parser.add_argument("--flow-model", type=Path, help="the digits-flow directory (for --models digits-flow)")
    parser.add_argument("--video-model", type=Path, help="the moving-digits directory (--models moving-digits)")
    parser.add_argument("--out", type=Path, default=RESULTS / "parallel_cfg.json")
    args = parser.parse_args()
    from fastdiff import FastPipeline

    makers = {
        "tiny-sd": lambda: build("tiny-sd", args.cache / "tiny-sd-bench", size="bench"),
        "digits": lambda: ensure_digits(args.cache / "digits"),
        "digits-flow": lambda: args.flow_model,
        "moving-digits": lambda: args.video_model,
    }
    out = {}
    for name in args.models.split(","):
        model = makers[name]()
        pipe = FastPipeline.from_pretrained(model).pipe
        call = make_inputs(pipe, *CALLS[name])
        sampler = SAMPLERS.get(name, "scheduler(name=dpm++2m,steps=20)")
        out[name] = {
            "sampler": sampler,
            "call": {k: v for k, v in call.items() if k != "prompt"},
            **measure(model, call, args.runs, sampler),
        }
        print(name, json.dumps({k: v for k, v in out[name].items() if k != "call"}), flush=True)
    RESULTS.mkdir(exist_ok=True)
    write_record(args.out, out, benchmark="parallel_cfg", indent=2)


if __name__ == "__main__":
    main()
