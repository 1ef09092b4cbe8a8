"""Tuned timestep schedules against the default and the best standard spacing, on the two yardsticks.

Run (one torch thread; heavy, so under the shared lock)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/tune_schedules.py gmm     # ~30 min
    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/tune_schedules.py digits  # ~25 min

``gmm``: for dpm++2m, unipc, ddim, euler and deis at NFE 4, 6, 8, 10, the ``ode_error`` (256 samples of seed
0, as ``fastdiff bench gmm`` measures it) of the preset's default spacing, of every standard spacing (the
scheduler's own Karras / exponential / beta / lu / linspace sigmas where it has them, and the integer spacings
the tuner starts from, run through the same route as the tuned one), and of the schedule that
``tune(...)`` finds with the CLI's defaults (calibration seeds 1000-1007, 256 samples each). Tuned schedules
of the tunable samplers are applied with ``scheduler(name=X);timesteps(path=...)``; DDIM, whose scheduler takes
no timesteps, is tuned and run as first-order DPM-Solver++ (the same update; equal to DDIM's default output
where 1000 is a multiple of NFE, see ``ddim_as_dpm1``). ``digits``: DPM++2M at NFE 4, 5, 8, default vs
Karras vs tuned (tuned on seeds 1000-1001, 64 images each, against DPM++2M Karras at 100 steps; measured by
``run_bench`` on seed 0, 500 images: accuracy, FD, and the distance to that reference on seed 0).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import diffusers
import torch

from fastdiff import FastPipeline
from fastdiff.eval.bench import make_inputs, run_bench
from fastdiff.eval.record import write_record
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.schedulers.tuned import ROUTES
from fastdiff.schedulers.tuning import references, sample, standard_spacings, tune
from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler
from fastdiff.zoo.gmm_exact import ode_error

RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULES = Path("/tmp/fastdiff-schedules")  # the tuned JSON files (their contents are in the results)
SAMPLERS, NFES = ("dpm++2m", "unipc", "ddim", "euler", "deis"), (4, 6, 8, 10)
MEASURE_SEEDS = list(range(8))  # 8 x 256 held-out samples; the calibration seeds are 1000-1007
NATIVE = {
    "karras (own)": {"use_karras_sigmas": True},
    "exponential (own)": {"use_exponential_sigmas": True},
    "beta (own)": {"use_beta_sigmas": True},
    "lu (own)": {"use_lu_lambdas": True},
    "linspace (own)": {"timestep_spacing": "linspace"},
}


def ddim_standin(config):
    # DDIMScheduler takes no custom timesteps; first-order DPM-Solver++ is the DDIM update.
    return diffusers.DPMSolverMultistepScheduler.from_config(
        config, algorithm_type="dpmsolver++", solver_order=1, timestep_spacing="trailing"
    )


def run_gmm(max_evals: int, samplers=SAMPLERS, nfes=NFES) -> dict:
    pipe = GMMPipeline(GMMDenoiser(mixture_seed=0), default_scheduler())  # = fastdiff zoo build gmm (seed 0)
    pipe.set_progress_bar_config(disable=True)
    config, inputs = pipe.scheduler.config, make_inputs(pipe)
    exact = references(pipe, inputs, MEASURE_SEEDS, 0)[0]
    rows = []
    for sampler in samplers:
        base = make_scheduler(sampler, config)
        routed = ddim_standin(config) if sampler == "ddim" else copy.deepcopy(base)
        route = ROUTES[type(routed).__name__]
        for nfe in nfes:
            started = time.time()

            def errors(scheduler, timesteps=None, route=None, nfe=nfe):
                pipe.scheduler = scheduler
                return summary([ode_error(sample(pipe, inputs, s, nfe, timesteps, route), exact[s]) for s in exact])

            default = errors(base)
            standard = {}
            for name, flags in NATIVE.items():
                if all(key in type(base)().config for key in flags):
                    standard[name] = errors(type(base).from_config(base.config, **flags))
            for name, ts in standard_spacings(routed, nfe).items():
                standard[name] = errors(routed, ts, route)
            pipe.scheduler = default_scheduler()
            standin = routed if sampler == "ddim" else None
            tuned = tune(pipe, sampler, nfe, max_evals=max_evals, progress=False, scheduler=standin)
            if sampler == "ddim":
                tuned_errors, extra = errors(routed, tuned.timesteps, route), {"ddim_as_dpm1": errors(routed)}
            else:  # through the accelerator, as a user applies it
                path = SCHEDULES / f"gmm-{sampler}-{nfe}.json"
                tuned.save(path)
                fp = FastPipeline(pipe)
                fp.accelerate(f"scheduler(name={sampler});timesteps(path={path})")
                outs = {
                    s: fp(**inputs, generator=torch.Generator().manual_seed(s), output_type="pt").images for s in exact
                }
                tuned_errors, extra = summary([ode_error(outs[s], exact[s]) for s in exact]), {}
                fp.unwrap()
            row = {"sampler": sampler, "nfe": nfe, "default": default, "tuned": tuned_errors}
            for key in ("held_out", "seed0"):
                best = min(standard, key=lambda name, key=key: standard[name][key])
                row[f"best_standard_{key}"] = [best, standard[best][key]]
                row[f"vs_best_standard_{key}"] = 1 - tuned_errors[key] / standard[best][key]
                row[f"vs_default_{key}"] = 1 - tuned_errors[key] / default[key]
            row.update(
                standard=standard,
                timesteps=tuned.timesteps,
                sigmas=tuned.sigmas,
                calibration=tuned.objective,
                log=tuned.log,
                seconds=time.time() - started,
                **extra,
            )
            rows.append(row)
            best, value = row["best_standard_held_out"]
            print(
                f"{sampler:8s} NFE {nfe:2d}: default {default['held_out']:.4f}  best standard {value:.4f} ({best})  "
                f"tuned {tuned_errors['held_out']:.4f} ({-row['vs_best_standard_held_out']:+.0%}; seed 0: "
                f"{-row['vs_best_standard_seed0']:+.0%})  {row['seconds']:.0f}s",
                flush=True,
            )
    measure = {"seeds": MEASURE_SEEDS, "samples_per_seed": inputs["batch_size"]}
    return {"measure": measure, "max_evals": max_evals, "rows": rows}


def summary(per_seed: list[float]) -> dict:
    """Mean over the held-out seeds, seed 0 alone (what ``fastdiff bench gmm`` measures), and each seed."""
    return {"held_out": sum(per_seed) / len(per_seed), "seed0": per_seed[0], "per_seed": per_seed}


def run_digits(max_evals: int) -> dict:
    from fastdiff.cli.main import resolve_model

    fp = FastPipeline.from_pretrained(resolve_model("digits", "bench"))
    fp.pipe.set_progress_bar_config(disable=True)
    inputs = make_inputs(fp.pipe)
    reference = references(fp.pipe, inputs, [0], 100)[0][0]
    configs, tuned_info, distances = [], {}, {}
    for nfe in (4, 5, 8):
        started = time.time()
        tuned = tune(fp.pipe, "dpm++2m", nfe, seeds=2, batch=64, max_evals=max_evals, starts=1, progress=False)
        path = SCHEDULES / f"digits-dpm++2m-{nfe}.json"
        tuned.save(path)
        tuned_info[nfe] = {**json.loads(path.read_text()), "seconds": time.time() - started}
        named = [
            (f"default-{nfe}", f"scheduler(name=dpm++2m,steps={nfe})"),
            (f"karras-{nfe}", f"scheduler(name=dpm++2m-karras,steps={nfe})"),
            (f"tuned-{nfe}", f"scheduler(name=dpm++2m);timesteps(path={path})"),
        ]
        for name, specs in named:
            handle = fp.accelerate(specs)
            out = fp(**inputs, generator=torch.Generator().manual_seed(0), output_type="pt").images
            distances[name] = ode_error(out, reference)
            handle.remove()
        configs += named
        print(f"NFE {nfe}: tuned {tuned.timesteps} in {time.time() - started:.0f}s", flush=True)
    bench = run_bench(fp, configs, steps=None, runs=1, seed=0, warmup=False)
    for row in bench["configs"]:
        row["distance_to_reference"] = distances[row["name"]]
        print(
            f"{row['name']:10s} accuracy {row['accuracy']:.3f}  FD {row['fd']:.2f}  distance {distances[row['name']]:.3f}"
        )
    return {
        "reference": "DPM-Solver++(2M) Karras, 100 steps, seed 0",
        "max_evals": max_evals,
        "tuned": tuned_info,
        "bench": bench,
    }


def tables() -> str:
    """Markdown tables of both results files."""
    lines = [
        "| sampler | NFE | default | best standard (which) | tuned | tuned vs best standard | seed 0 only |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in json.loads((RESULTS / "schedules_gmm.json").read_text())["rows"]:
        best, value = r["best_standard_held_out"]
        lines.append(
            f"| {r['sampler']} | {r['nfe']} | {r['default']['held_out']:.3f} | {value:.3f} ({best}) | "
            f"{r['tuned']['held_out']:.3f} | {-r['vs_best_standard_held_out']:+.0%} | "
            f"{-r['vs_best_standard_seed0']:+.0%} |"
        )
    digits = json.loads((RESULTS / "schedules_digits.json").read_text())
    lines += ["", "| config | NFE | accuracy | FD | distance to reference |", "|---|---|---|---|---|"]
    for row in sorted(digits["bench"]["configs"], key=lambda r: int(r["name"].split("-")[1])):
        name, nfe = row["name"].split("-")
        lines.append(
            f"| {name} | {nfe} | {row['accuracy']:.1%} | {row['fd']:.2f} | {row['distance_to_reference']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["gmm", "digits", "table"], help="table: print the results as markdown")
    parser.add_argument("--max-evals", type=int, default=None, help="default: 1500 (gmm), 250 (digits)")
    parser.add_argument("--samplers", nargs="+", default=SAMPLERS, help="gmm: samplers to run")
    parser.add_argument("--nfes", nargs="+", type=int, default=NFES, help="gmm: NFEs to run")
    parser.add_argument("--out", type=Path, default=None, help="results file (default: benchmarks/results/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.which == "table":
        print(tables())
        return
    if args.which == "gmm":
        result = run_gmm(args.max_evals or 1500, args.samplers, args.nfes)
    else:
        result = run_digits(args.max_evals or 250)
    out = args.out or RESULTS / f"schedules_{args.which}.json"
    write_record(out, result, benchmark="tune_schedules", indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
