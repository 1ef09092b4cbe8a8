"""``fastdiff fit-teacache``: fit TeaCache's rescaling polynomial for a model, for ``blockcache(mode=teacache)``.

Example::

    fastdiff fit-teacache digits-flow --steps 28 --calls 4 --out teacache.json
    fastdiff bench digits-flow --config "tea=blockcache(mode=teacache,threshold=0.3,fit=teacache.json)"

Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` does the work.
"""

from __future__ import annotations

import argparse
import json

from fastdiff.cli.args import POSITIVE, IntRange, accel_specs


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "fit-teacache", help="fit the output-change polynomial of blockcache(mode=teacache) on full calls"
    )
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--accel",
        default="",
        type=accel_specs,
        help="accelerators to fit under (a sampler preset), ';'-separated",
    )
    p.add_argument("--steps", type=IntRange(3), default=28, help="steps per call (default 28)")
    p.add_argument("--calls", type=POSITIVE, default=4, help="calls, seeds 1000, 1001, ... (default 4)")
    p.add_argument("--batch", type=POSITIVE, default=None, help="images per call (default: the bench batch)")
    p.add_argument("--degree", type=POSITIVE, default=4, help="polynomial degree (default 4, as TeaCache)")
    p.add_argument(
        "--guidance", type=float, default=None, help="guidance scale (default: the model's bench guidance)"
    )
    p.add_argument("--out", required=True, help="write the fit JSON here")
    p.set_defaults(func=run)
    return p


def run(args) -> dict:
    import torch

    from fastdiff.cache.teacache import fit_rescaling
    from fastdiff.cli.resolve import resolve_model
    from fastdiff.core.inputs import make_inputs
    from fastdiff.core.pipeline import FastPipeline

    if args.steps < 3 or args.calls < 1 or args.degree < 1:
        raise ValueError(
            f"--steps must be >= 3, --calls >= 1 and --degree >= 1; got {args.steps}, {args.calls}, {args.degree}"
        )
    fp = FastPipeline.from_pretrained(resolve_model(args.model, args.size), accelerators=args.accel or None)
    fp.set_progress_bar_config(disable=True)
    calls = [
        dict(make_inputs(fp.pipe, args.batch, guidance=args.guidance), num_inference_steps=args.steps, output_type="np",
             generator=torch.Generator().manual_seed(1000 + i))
        for i in range(args.calls)
    ]  # fmt: skip
    fit = fit_rescaling(fp, calls, args.degree)
    with open(args.out, "w") as f:
        json.dump(fit, f, indent=1)
    print(f"fitted {fit['points']} points, rms error {fit['rms_error']:.4g}; wrote {args.out}")
    return fit
