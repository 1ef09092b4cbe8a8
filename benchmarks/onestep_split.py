"""Where the time of a one-step call goes: text encoder, denoiser, VAE decode, scheduler, other, at one
denoiser call per image (what a one-step student costs), on digits-flow and at SD 1.5 size.

Run (alone: a few minutes on 2 CPU cores)::

    .venv/bin/python -m benchmarks.onestep_split --runs 3
    .venv/bin/python -m benchmarks.onestep_split --runs 3 --tiny-vae DIR --json benchmarks/results/tiny_vae_split.json

Models: digits-flow (``fastdiff zoo build digits-flow --size bench``: SD3 pipeline, 32 px latents; batch 1 and
64) and SD 1.5 (the zoo's full-size layout built in memory, fp32, random weights, 512 px, batch 1). Each call is
``num_inference_steps=1``, guidance 1 (a student bakes guidance in). ``fastdiff.eval.profile.profile_call``
times each component with named hooks; after one warm-up call, ``--runs`` calls; the medians are reported
with each component's share. Writes ``benchmarks/results/onestep_split.json``.

``--tiny-vae DIR`` adds each call again with ``tiny-vae``, in alternating order: on digits-flow with the tiny
decoder in ``DIR`` (``fastdiff distill tiny-vae``; digits-flow's VAE has digits-sd's weights), at SD 1.5 size with
an ``AutoencoderTiny`` of TAESD's default layout and random weights (speed only: random weights say nothing of
quality).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.core.inputs import make_inputs
from fastdiff.eval.profile import profile_call
from fastdiff.eval.provenance import load_average, provenance
from fastdiff.eval.record import write_record
from fastdiff.zoo import build
from fastdiff.zoo.full_size import make_full_pipeline

RESULTS = Path(__file__).resolve().parent / "results"


def _summary(rows: list[dict], **info) -> dict:
    median = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0]}
    return {
        **info,
        "seconds": median,
        "share": {k: v / median["total"] for k, v in median.items() if k != "total"},
        "runs": rows,
    }


def split(fp, batch: int, runs: int, side: int | None = None, tiny: str | None = None) -> list[dict]:
    """The split of a one-step call; with ``tiny``, also with ``tiny-vae(path=tiny)``, the two alternating."""
    call = dict(make_inputs(fp.pipe, batch, 1.0), output_type="np", num_inference_steps=1)
    if side:
        call.update(height=side, width=side)
    specs = [None] + ([f"tiny-vae(path={tiny})"] if tiny else [])
    rows: dict = {spec: [] for spec in specs}
    for i in range(runs + 1):  # the first round warms up
        for spec in specs:
            handle = fp.accelerate(spec) if spec else None
            row = profile_call(fp, call, top=1)[0]
            if i:
                rows[spec].append(row)
            if handle is not None:
                handle.remove()
    return [_summary(rows[spec], batch=batch, side=side, accelerators=spec) for spec in specs]


def taesd_layout(vae, directory: Path) -> str:
    """An ``AutoencoderTiny`` of TAESD's default layout (random weights) for ``vae``'s latents, saved in ``directory``."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(0)
    AutoencoderTiny(
        in_channels=vae.config.in_channels,
        out_channels=vae.config.out_channels,
        latent_channels=vae.config.latent_channels,
    ).save_pretrained(directory)
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", default="/tmp/fastdiff-onestep-split")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=str(RESULTS / "onestep_split.json"))
    parser.add_argument("--tiny-vae", default=None, metavar="DIR", help="also time each call with tiny-vae")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start, work, models = load_average(), Path(args.work), {}
    flow = FastPipeline.from_pretrained(build("digits-flow", work / "digits-flow", size="bench"))
    flow.pipe.set_progress_bar_config(disable=True)
    models["digits-flow"] = [row for b in (1, 64) for row in split(flow, b, args.runs, tiny=args.tiny_vae)]
    del flow
    sd15 = FastPipeline(make_full_pipeline("sd15", seed=0, dtype=torch.float32))  # in memory, fp32
    sd15.pipe.set_progress_bar_config(disable=True)
    tiny = taesd_layout(sd15.pipe.vae, work / "taesd-layout") if args.tiny_vae else None
    models["sd15"] = split(sd15, 1, args.runs, side=512, tiny=tiny)
    result = {"models": models, "threads": args.threads, **provenance(load_start=load_start)}
    write_record(args.json, result, benchmark="onestep_split", indent=1)
    for name, rows in models.items():
        for row in rows:
            parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(row["share"].items(), key=lambda kv: -kv[1]))
            extra = f" + {row['accelerators']}" if row["accelerators"] else ""
            print(f"{name} batch {row['batch']}{extra}: {row['seconds']['total']:.3f} s ({parts})")


if __name__ == "__main__":
    main()
