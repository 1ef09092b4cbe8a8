"""``fastdiff fit-teacache`` and ``fastdiff fit-first-block``: fit files for ``blockcache``, made on the model.

``fit-teacache`` fits TeaCache's rescaling polynomial (``blockcache(mode=teacache,fit=...)``) on full calls;
``fit-first-block`` calibrates the first-block threshold on one call within a PSNR budget
(``blockcache(mode=first-block,fit=...)``, ``fastdiff.cache.calibrate``). Both call the model with its own bench
inputs and guidance unless told otherwise.

Example::

    fastdiff fit-teacache digits-flow --steps 28 --calls 4 --out teacache.json
    fastdiff bench digits-flow --config "tea=blockcache(mode=teacache,threshold=0.3,fit=teacache.json)"
    fastdiff fit-first-block digits-flow --psnr 30 --out first-block.json
    fastdiff bench digits-flow --config "fbc=blockcache(mode=first-block,fit=first-block.json)"

Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` and ``run_first_block(args)``
do the work.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from fastdiff.cli.args import NON_NEGATIVE, POSITIVE, POSITIVE_FLOAT, IntRange, accel_specs

FIRST_BLOCK_BATCH = 4  # one small batch: the budget is checked on each of its images


def model_options(p: argparse.ArgumentParser, batch_default: str) -> None:
    """The options both fits share: which model, under which accelerators, called how."""
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--accel",
        default="",
        type=accel_specs,
        help="accelerators to fit under (a sampler preset), ';'-separated",
    )
    p.add_argument("--steps", type=IntRange(3), default=28, help="steps per call (default 28)")
    p.add_argument("--batch", type=POSITIVE, default=None, help=f"images per call (default: {batch_default})")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the model's bench guidance)")
    p.add_argument("--out", required=True, help="write the fit JSON here")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "fit-teacache", help="fit the output-change polynomial of blockcache(mode=teacache) on full calls"
    )
    model_options(p, "the bench batch")
    p.add_argument("--calls", type=POSITIVE, default=4, help="calls, seeds 1000, 1001, ... (default 4)")
    p.add_argument("--degree", type=POSITIVE, default=4, help="polynomial degree (default 4, as TeaCache)")
    p.set_defaults(func=run)
    q = subparsers.add_parser(
        "fit-first-block",
        help="calibrate the threshold of blockcache(mode=first-block) on one call within a PSNR budget",
    )
    model_options(q, str(FIRST_BLOCK_BATCH))
    q.add_argument(
        "--psnr",
        type=POSITIVE_FLOAT,
        default=None,
        help="budget: the lowest PSNR in dB of any image against the uncached call (default 30: an RMS error "
        "of about 3%% of the pixel range)",
    )
    q.add_argument("--seed", type=NON_NEGATIVE, default=1000, help="the call's seed (default 1000)")
    q.set_defaults(func=run_first_block)
    return p


def pipeline(args):
    """The FastPipeline of ``args.model`` under ``args.accel``, its progress bar off."""
    from fastdiff.cli.resolve import resolve_model
    from fastdiff.core.pipeline import FastPipeline

    fp = FastPipeline.from_pretrained(resolve_model(args.model, args.size), accelerators=args.accel or None)
    fp.set_progress_bar_config(disable=True)
    return fp


def call_kwargs(fp, args, batch: int | None) -> dict:
    """One call's kwargs but the generator: the model's bench inputs and guidance unless ``args`` say otherwise."""
    from fastdiff.core.inputs import make_inputs

    return dict(make_inputs(fp.pipe, batch, guidance=args.guidance), num_inference_steps=args.steps, output_type="np")


def run(args) -> dict:
    import torch

    from fastdiff.cache.blockcache_teacache import fit_rescaling

    if args.steps < 3 or args.calls < 1 or args.degree < 1:
        raise ValueError(
            f"--steps must be >= 3, --calls >= 1 and --degree >= 1; got {args.steps}, {args.calls}, {args.degree}"
        )
    fp = pipeline(args)
    calls = [
        dict(call_kwargs(fp, args, args.batch), generator=torch.Generator().manual_seed(1000 + i))
        for i in range(args.calls)
    ]
    fit = fit_rescaling(fp, calls, args.degree)
    options = ["--calls", str(args.calls), "--degree", str(args.degree)]
    options += ["--batch", str(args.batch)] if args.batch is not None else []
    fit = write_fit(args, "fit-teacache", options, fit)
    print(f"fitted {fit['points']} points, rms error {fit['rms_error']:.4g}; wrote {args.out}")
    return fit


def write_fit(args, name: str, options: list[str], fit: dict) -> dict:
    """Write ``fit`` to ``args.out`` as a results record: the fit's fields (what ``read_fit`` reads), the command
    line that decides it (every option, defaults included) and this run's provenance (commit, date, device,
    load). Returns what was written."""
    from fastdiff.eval.record import write_record

    words = ["fastdiff", name, args.model, "--size", args.size, "--steps", str(args.steps), *options]
    words += ["--guidance", str(args.guidance)] if args.guidance is not None else []
    words += ["--accel", args.accel] if args.accel else []
    command = shlex.join([*words, "--out", args.out])
    return write_record(args.out, {**fit, "command": command}, benchmark=name.replace("-", "_"), indent=1)


def run_first_block(args) -> dict:
    from fastdiff.cache.calibrate import DEFAULT_PSNR, fit_first_block

    psnr = DEFAULT_PSNR if args.psnr is None else args.psnr
    batch = args.batch or FIRST_BLOCK_BATCH
    fp = pipeline(args)
    if not Path(args.out).expanduser().resolve().parent.is_dir():
        raise FileNotFoundError(f"--out {args.out!r}: its directory does not exist")
    call = call_kwargs(fp, args, batch)
    fit = fit_first_block(fp, call, psnr, seed=args.seed)
    plain = (str, int, float, bool, type(None))
    inputs = {
        k: v
        for k, v in call.items()
        if isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v))
    }
    fit.update(
        settings={"size": args.size, "accel": args.accel, "seed": args.seed, "batch": batch, "call": inputs},
        source=args.model,
    )
    options = ["--batch", str(batch), "--psnr", f"{psnr:g}", "--seed", str(args.seed)]
    fit = write_fit(args, "fit-first-block", options, fit)
    reached = "identical images" if fit["psnr"] is None else f"PSNR {fit['psnr']:.2f} dB"
    print(
        f"threshold {fit['threshold']:.6g}: {reached} (budget {psnr:g} dB), {fit['computed_steps']} of "
        f"{fit['total_steps']} steps computed, {len(fit['tries'])} cached calls tried; wrote {args.out}"
    )
    return fit
