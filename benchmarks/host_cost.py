"""Host time fastdiff adds per denoising step, with no accelerator and with each accelerator.

On a GPU an eager denoiser step is a train of kernel launches; Python work the wrapper adds per step shows
directly in the step time. Two measurements, one torch thread, CPU time:

1. **Identity denoiser** (no accelerator): a hook makes tiny-sd's UNet return its input at no cost inside a
   real ``StableDiffusionPipeline``, so a call is the pipeline's own Python plus what the wrapper adds. Calls
   alternate raw / wrapped, at N and 3N steps; the added time per step is the slope of (median wrapped -
   median raw) over the step count, the rest is per call.
2. **Per accelerator** (the real test-size UNet or SD3 transformer, so block hooks fire): the time spent in
   fastdiff's own Python (cProfile ``tottime`` of functions defined under ``fastdiff/``; the torch work they
   launch is excluded), per step: the difference between a 16- and an 8-step call, divided by 8, so
   per-call work (argument checks, hook installation) drops out. Upper bounds: cProfile's own cost per
   Python call inflates them, and tensor arithmetic written as operators (``a * b``) inside a fastdiff
   function counts as its time (on the CPU that computes; on a GPU it only launches).

Targets: <= 20 us per step with no accelerator, <= 100 us for hook-based accelerators.

    python benchmarks/host_cost.py --pairs 30 --json benchmarks/results/host_cost.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time
from datetime import date
from pathlib import Path

import torch
from diffusers.hooks import HookRegistry, ModelHook

import fastdiff
from fastdiff import FastPipeline
from fastdiff.eval.provenance import with_provenance
from fastdiff.zoo.tiny import make_pipeline

PACKAGE = os.path.dirname(fastdiff.__file__)
UNET_SPECS = ["none", "deepcache(interval=3)", "tome(ratio=0.5)", "cfg-interval(start=0.0,end=0.5)",
              "forecast(order=1,interval=2,warmup=2)", "promptcache", "scheduler(name=dpm++2m)"]  # fmt: skip
SD3_SPECS = ["none", "blockcache(mode=interval,interval=2)", "blockcache(mode=first-block,threshold=0.1)",
             "blockcache(mode=teacache,threshold=0.3)", "forecast(order=1,interval=2,warmup=2)"]  # fmt: skip
CALLS = {
    "tiny-sd": {"prompt": ["a cat", "a dog"], "output_type": "latent"},
    "tiny-sd3": {"prompt": ["a cat", "a dog"], "output_type": "latent", "height": 32, "width": 32},
}


class IdentityDenoiser(ModelHook):
    """Returns the noisy sample unchanged: a denoiser that costs nothing (benchmark only)."""

    def new_forward(self, module, *args, **kwargs):
        return (args[0] if args else kwargs["sample"],)


def cpu_seconds(fn, call: dict) -> float:
    start = time.process_time()
    fn(**call)
    return time.process_time() - start


def identity_cost(steps: int, pairs: int) -> dict:
    """Added CPU time per step: the wrapped-minus-raw difference at ``steps`` and at ``3 * steps`` steps, so
    what the wrapper does once per call (argument checks, hook setup) drops out of the slope."""
    pipe = make_pipeline("tiny-sd", "test")
    pipe.set_progress_bar_config(disable=True)
    HookRegistry.check_if_exists_or_initialize(pipe.unet).register_hook(IdentityDenoiser(), "identity")
    fp = FastPipeline(pipe)
    added = {}
    for n in (steps, 3 * steps):
        call = dict(CALLS["tiny-sd"], num_inference_steps=n)
        raw, wrapped = [], []
        for i in range(pairs + 2):  # two warm-up pairs
            r, w = cpu_seconds(pipe, call), cpu_seconds(fp, call)
            if i >= 2:
                raw.append(r)
                wrapped.append(w)
        added[n] = statistics.median(wrapped) - statistics.median(raw)
    per_step = (added[3 * steps] - added[steps]) / (2 * steps)
    return {"steps": [steps, 3 * steps], "pairs": pairs, "added_ms_per_call": {n: 1e3 * v for n, v in added.items()},
            "added_us_per_step": 1e6 * per_step, "added_us_per_call": 1e6 * (added[steps] - steps * per_step)}  # fmt: skip


def fastdiff_seconds(fp, call: dict) -> float:
    """Seconds of one call spent in fastdiff's own Python (cProfile tottime of its functions)."""
    profile = cProfile.Profile()
    profile.enable()
    fp(**call)
    profile.disable()
    stats = pstats.Stats(profile).stats
    return sum(row[2] for (filename, _, _), row in stats.items() if filename.startswith(PACKAGE))


def accelerator_cost(model: str, spec: str, repeats: int) -> dict:
    from fastdiff.zoo.tiny_flow import make_flow_pipeline

    torch.manual_seed(0)
    pipe = make_flow_pipeline(model) if model == "tiny-sd3" else make_pipeline(model, "test")
    pipe.set_progress_bar_config(disable=True)
    fp = FastPipeline(pipe, accelerators=None if spec == "none" else spec)
    fp(**CALLS[model], num_inference_steps=8)  # warm-up
    per_step = []
    for _ in range(repeats):
        short = fastdiff_seconds(fp, dict(CALLS[model], num_inference_steps=8))
        long = fastdiff_seconds(fp, dict(CALLS[model], num_inference_steps=16))
        per_step.append((long - short) / 8)
    return {"model": model, "spec": spec, "us_per_step": 1e6 * statistics.median(per_step)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    identity = identity_cost(args.steps, args.pairs)
    print(f"identity denoiser, no accelerator: {identity['added_us_per_step']:+.1f} us per step, "
          f"{identity['added_us_per_call']:+.0f} us per call")  # fmt: skip
    rows = []
    for model, specs in (("tiny-sd", UNET_SPECS), ("tiny-sd3", SD3_SPECS)):
        for spec in specs:
            rows.append(accelerator_cost(model, spec, args.repeats))
            print(f"{model:9s} {spec:48s} {rows[-1]['us_per_step']:7.1f} us per step in fastdiff's Python")
    if args.json:
        result = {"benchmark": "host_cost", "date": str(date.today()), "device": "CPU, 1 torch thread",
                  "command": f"python benchmarks/host_cost.py --pairs {args.pairs} --repeats {args.repeats} "
                             f"--steps {args.steps} --json {args.json}",
                  "targets_us_per_step": {"no accelerator": 20, "hook-based": 100},
                  "identity": identity, "accelerators": rows}  # fmt: skip
        args.json.write_text(json.dumps(with_provenance(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
