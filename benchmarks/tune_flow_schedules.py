"""Tuned flow schedules on gmm-flow vs the best standard flow schedule: ode_error on held-out seeds.

For each NFE: every flow sampler preset (flow-euler, flow-dpm++2m, flow-unipc) with its own default spacing at
shift 1 and shift 3 (what diffusers computes, run as diffusers runs it) -> *best standard*; the tuner's integer
standard spacings (``tuning_flow.flow_spacings``, run through the schedule route) -> *best grid standard*;
``tune()`` of each preset (calibration seeds 1000+, default settings but ``--seeds``/``--max-evals``) evaluated
through the same route ``timesteps(path=...)`` installs -> *tuned*. Errors are the mean ``ode_error`` against the
exact DOP853 flow solve over held-out seeds 0 .. E-1 (``--eval-seeds``) x ``--batch`` samples.

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/tune_flow_schedules.py   # one thread
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff.eval.record import write_record
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.schedulers.tuning import sample, tune
from fastdiff.schedulers.tuning_flow import flow_spacings
from fastdiff.zoo.gmm_flow import (
    GMMFlowDenoiser,
    GMMFlowPipeline,
    default_scheduler,
    exact_samples,
    initial_noise,
    ode_error,
)

SAMPLERS = ("flow-euler", "flow-dpm++2m", "flow-unipc")
SHIFTS = (1.0, 3.0)
OUT = Path(__file__).parent / "results" / "tune_flow_schedules.json"


def held_out_error(pipe, refs: dict, batch: int, steps: int, timesteps=None) -> float:
    inputs = {"batch_size": batch}
    route = "flow" if timesteps is not None else None
    return float(np.mean([ode_error(sample(pipe, inputs, s, steps, timesteps, route), r) for s, r in refs.items()]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nfes", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--seeds", type=int, default=4, help="calibration seeds for tune()")
    parser.add_argument("--eval-seeds", type=int, default=4, help="held-out seeds 0..E-1")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-evals", type=int, default=600)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    torch.set_num_threads(1)

    pipe = GMMFlowPipeline(GMMFlowDenoiser(mixture_seed=0), default_scheduler())
    pipe.set_progress_bar_config(disable=True)
    base = pipe.scheduler
    refs = {s: exact_samples(pipe, initial_noise(pipe, args.batch, s)) for s in range(args.eval_seeds)}
    rows = []
    for nfe in args.nfes:
        row: dict = {"nfe": nfe, "standard": {}, "grid_standard": {}, "tuned": {}}
        for sampler in SAMPLERS:
            for shift in SHIFTS:
                pipe.scheduler = make_scheduler(sampler, default_scheduler(shift).config)
                row["standard"][f"{sampler} shift{shift:g}"] = held_out_error(pipe, refs, args.batch, nfe)
            pipe.scheduler = make_scheduler(sampler, base.config)
            for name, indices in flow_spacings(pipe.scheduler, nfe).items():
                timesteps = [i + 1 for i in indices]
                error = held_out_error(pipe, refs, args.batch, nfe, timesteps)
                row["grid_standard"][f"{sampler} {name}"] = error
            pipe.scheduler = base
            start = time.perf_counter()
            tuned = tune(
                pipe, sampler, nfe, seeds=args.seeds, batch=args.batch, max_evals=args.max_evals, progress=False
            )
            seconds = time.perf_counter() - start
            pipe.scheduler = make_scheduler(sampler, base.config)
            row["tuned"][sampler] = {
                "ode_error": held_out_error(pipe, refs, args.batch, nfe, tuned.timesteps),
                "timesteps": tuned.timesteps,
                "sigmas": tuned.sigmas,
                "calibration": tuned.objective["tuned"],
                "start": tuned.objective["start"],
                "evaluations": tuned.objective["evaluations"],
                "seconds": round(seconds, 1),
            }
            pipe.scheduler = base
        best_std = min(row["standard"], key=row["standard"].get)
        best_grid = min(row["grid_standard"], key=row["grid_standard"].get)
        best_tuned = min(row["tuned"], key=lambda k: row["tuned"][k]["ode_error"])
        row["best"] = {
            "standard": [best_std, row["standard"][best_std]],
            "grid_standard": [best_grid, row["grid_standard"][best_grid]],
            "tuned": [best_tuned, row["tuned"][best_tuned]["ode_error"]],
        }
        row["tuned_vs_best_standard"] = row["tuned"][best_tuned]["ode_error"] / row["standard"][best_std] - 1
        rows.append(row)
        print_row(row)
    result = {
        "model": "gmm-flow (GMMFlowDenoiser mixture_seed 0, FlowMatchEuler shift 1)",
        "metric": f"mean ode_error vs exact DOP853 flow solve, held-out seeds 0..{args.eval_seeds - 1} x "
        f"{args.batch} samples",
        "settings": vars(args),
        "threads": 1,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.out), result, benchmark="tune_flow_schedules", indent=1)
    print(f"wrote {args.out}")


def print_row(row: dict) -> None:
    best = row["best"]
    tuned = ", ".join(f"{k} {v['ode_error']:.4f}" for k, v in row["tuned"].items())
    print(
        f"NFE {row['nfe']}: best standard {best['standard'][1]:.4f} ({best['standard'][0]}); best grid standard "
        f"{best['grid_standard'][1]:.4f} ({best['grid_standard'][0]}); tuned {tuned}; best tuned "
        f"{best['tuned'][1]:.4f} ({best['tuned'][0]}) = {row['tuned_vs_best_standard']:+.0%} vs best standard",
        flush=True,
    )


if __name__ == "__main__":
    main()
