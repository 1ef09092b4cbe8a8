"""``fastdiff tpu-infer``: a pipeline with accelerators on a torch-xla device (TPU), timed, with XLA metrics.

Example (a TPU VM: ``PJRT_DEVICE=TPU``; anywhere else the XLA CPU backend: ``PJRT_DEVICE=CPU``)::

    PJRT_DEVICE=CPU .venv-xla/bin/fastdiff tpu-infer digits --accel "scheduler(name=dpm++2m,steps=20)" \\
        --batch 8 --runs 3 --out out/tpu-digits

Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` does the work.
"""

from __future__ import annotations

import argparse

from fastdiff.cli.args import FINITE, NON_NEGATIVE, POSITIVE, accel_specs


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``tpu-infer`` subcommand to ``subparsers`` (from ``parser.add_subparsers``)."""
    p = subparsers.add_parser(
        "tpu-infer", help="run a pipeline on a torch-xla device (TPU): warm-up, timed calls, XLA metrics"
    )
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--accel",
        default="",
        type=accel_specs,
        help="accelerator specs, e.g. 'scheduler(name=dpm++2m,steps=20)'",
    )
    p.add_argument("--batch", type=POSITIVE, default=1, help="images per call (a static shape: every call the same)")
    p.add_argument(
        "--steps",
        type=POSITIVE,
        help="denoising steps (default: the scheduler preset's, else the pipeline's)",
    )
    p.add_argument("--guidance", type=FINITE, help="guidance scale (default: the pipeline's)")
    p.add_argument("--bf16", action="store_true", help="load the weights in bfloat16")
    p.add_argument("--warmup", type=POSITIVE, default=1, help="untimed calls first (XLA compiles in them)")
    p.add_argument("--runs", type=POSITIVE, default=3, help="timed calls")
    p.add_argument("--seed", type=NON_NEGATIVE, default=0)
    p.add_argument("--device", default="xla", help="'xla' (default), 'xla:N', or 'cpu' for the same calls eagerly")
    p.add_argument("--out", help="directory for the last call's PNGs and metrics.json")
    p.set_defaults(func=run)
    return p


def run(args) -> dict:
    """Run the driver, print s/image and the XLA metrics; returns the result (images included)."""
    from fastdiff.cli.resolve import resolve_model
    from fastdiff.cli.tpu_infer import report, save, tpu_infer
    from fastdiff.core.registry import AcceleratorError

    for name in ("batch", "runs", "warmup", "steps"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise SystemExit(f"error: --{name} must be a positive integer, got {value}")
    try:
        result = tpu_infer(
            resolve_model(args.model, args.size),
            args.accel,
            batch=args.batch,
            steps=args.steps,
            bf16=args.bf16,
            warmup=args.warmup,
            runs=args.runs,
            seed=args.seed,
            guidance=args.guidance,
            device=args.device,
        )
    except (AcceleratorError, ImportError) as error:
        raise SystemExit(f"error: {error}") from error
    print(report(result))
    if args.out:
        print(f"wrote {save(result, args.out)}")
    return result
