"""``fastdiff tune-schedule``: tune the timesteps of a sampler for a model and write them as JSON.

Example::

    fastdiff tune-schedule gmm --sampler dpm++2m --nfe 6 --out schedule.json --seeds 8
    fastdiff bench gmm --config tuned="scheduler(name=dpm++2m);timesteps(path=schedule.json)"
    fastdiff tune-schedule gmm-flow --sampler flow-unipc --nfe 6 --out flow.json   # flow-matching models
    fastdiff bench gmm-flow --config tuned="scheduler(name=flow-unipc);timesteps(path=flow.json)"

Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` does the work.
"""

from __future__ import annotations

import argparse
import sys

from fastdiff.cli.args import POSITIVE


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``tune-schedule`` subcommand to ``subparsers`` (from ``parser.add_subparsers``)."""
    from fastdiff.schedulers.catalog import PRESETS, TUNABLE  # data only: building the parser loads no torch

    p = subparsers.add_parser(
        "tune-schedule", help="choose the timesteps of a sampler that come closest to the exact answer"
    )
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--sampler",
        required=True,
        choices=list(PRESETS),
        metavar="SAMPLER",
        help=f"sampler preset to tune: {', '.join(TUNABLE)} (flow-* for flow-matching models; the others are "
        "refused with the reason)",
    )
    p.add_argument("--nfe", type=POSITIVE, required=True, help="denoiser calls (= steps for these samplers)")
    p.add_argument("--out", required=True, help="write the schedule JSON here")
    p.add_argument("--seeds", type=POSITIVE, default=8, help="calibration seeds (1000, 1001, ...); default 8")
    p.add_argument("--batch", type=POSITIVE, default=None, help="images per seed (default: the bench batch)")
    p.add_argument("--max-evals", type=POSITIVE, default=1500, help="objective evaluations; default 1500")
    p.add_argument("--starts", type=POSITIVE, default=3, help="searches from the best N standard spacings")
    p.add_argument(
        "--pin-first", action="store_true", help="keep the first timestep at T-1 (default: the search may start lower)"
    )
    p.add_argument(
        "--reference-steps",
        type=POSITIVE,
        default=100,
        help="steps of the reference run (DPM++2M Karras; UniPC on flow sigmas for flow models); not on the "
        "exact models gmm and gmm-flow",
    )
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args) -> dict:
    """Tune, write ``args.out``, print the objective log; returns the written schedule as a dict."""
    import torch

    from fastdiff.cli.resolve import resolve_model
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.schedulers.tuned import untunable_reason
    from fastdiff.schedulers.tuning import tune

    if reason := untunable_reason(args.sampler):  # before loading the model
        raise SystemExit(f"error: {reason}")
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = FastPipeline.from_pretrained(resolve_model(args.model, args.size)).unwrap()
    tuned = tune(
        pipe,
        args.sampler,
        args.nfe,
        seeds=args.seeds,
        batch=args.batch,
        reference_steps=args.reference_steps,
        max_evals=args.max_evals,
        starts=args.starts,
        free_start=not args.pin_first,
        progress=not args.quiet,
    )
    tuned.save(args.out)
    o = tuned.objective
    print(f"reference: {o['reference']}; seeds {o['seeds']} x {o['batch']} samples", file=sys.stderr)
    for name, value in sorted(o["candidates"].items(), key=lambda kv: kv[1]):
        print(f"  {name:10s} {value:.4f}", file=sys.stderr)
    print("objective log (evaluations, best):", file=sys.stderr)
    for evals, value in tuned.log:
        print(f"  {evals:5d} {value:.4f}", file=sys.stderr)
    start = o["start"]
    gain = 1 - o["tuned"] / start["value"] if start["value"] else 0.0
    sigmas = f" (sigmas {tuned.sigmas[:-1]})" if args.sampler.startswith("flow-") else ""
    print(
        f"{args.sampler} NFE {args.nfe}: {start['spacing']} {start['value']:.4f} -> tuned {o['tuned']:.4f} "
        f"({gain:.0%} lower, {o['evaluations']} evaluations); timesteps {tuned.timesteps}{sigmas} -> {args.out}"
    )
    return vars(tuned)
