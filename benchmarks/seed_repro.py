"""Reproducible by seed: how far a served image changes when its request is batched with others, and the
throughput cost of ``Engine(exact_seeds=True)`` (``fastdiff serve --exact-seeds``), which gives every request
a pipeline call of its own.

Run alone on the 2-core machine, under the shared lock (about 5 minutes)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/seed_repro.py   # results/seed_repro.json
    .venv/bin/python benchmarks/seed_repro.py --models digits --requests 16 --rounds 3   # quicker

Models: the shipped digits reference (label requests) and tiny-sd at test size (prompt requests, every other
one with a negative prompt), both under the profile ``scheduler(name=dpm++2m,steps=10)`` at their default
guidance, one torch thread. For each model, ``--requests`` requests with distinct seeds (one image each):

- ``alone``: every request in a pipeline call of its own (``Engine.generate([request], ...)``);
- ``batched``, exact seeds off: the requests sent together, in calls of ``--batch`` images (what the server's
  batcher does when they queue at once);
- ``batched``, exact seeds on: the same ``Engine.generate`` calls on an ``exact_seeds=True`` engine, which runs
  each request by itself;
- the PNG pixels (0-255) of each against ``alone``: max and mean absolute difference over every value, the
  fraction of values that differ, and how many images differ at all;
- ``count``: the first ``--batch`` requests again with ``count=--count`` (seeds ``s .. s+count-1`` in one
  call), each image against its seed run alone with count 1: whether the count of a request changes its images;
- throughput (images/s) of the batched pass with exact seeds off and on, alternated (``--rounds`` rounds, the
  order swapped every round) after one warm-up pass each; medians, and the median of the per-round ratio
  on/off. Every round's images are checked to be identical to the first round's (repeatable).

Engine level (no HTTP): the server adds its own per-request costs to both configurations, and with
``--exact-seeds`` its batch wait (``--max-wait-ms``) defaults to 0 because no batch can fill.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fastdiff.eval.record import write_record
from fastdiff.serving.engine import Engine
from fastdiff.zoo import build
from fastdiff.zoo.shipped import install_digits

RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = "scheduler(name=dpm++2m,steps=10)"
SUBJECTS = ("a red fox", "a blue car", "a green tree", "a yellow house", "a white cat", "an old boat")


def model_dir(name: str, work: Path) -> Path:
    if name == "digits":
        return install_digits(work / "digits")
    return build("tiny-sd", work / "tiny-sd", size="test")


def make_requests(engine: Engine, n: int, count: int = 1) -> list:
    Request = engine.request_model()
    if engine.kind == "label":
        return [Request(label=i % 10, seed=1000 + 10 * i, count=count) for i in range(n)]
    return [
        Request(
            prompt=f"{SUBJECTS[i % len(SUBJECTS)]}, picture {i}",
            seed=1000 + 10 * i,
            count=count,
            negative_prompt="blurry, dark" if i % 2 else None,
        )
        for i in range(n)
    ]


def seeds_of(requests) -> list[list[int]]:
    return [[r.seed + k for k in range(r.count)] for r in requests]


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(np.int16)


def run_batched(engine: Engine, requests, batch: int) -> tuple[list[np.ndarray], float]:
    """The requests in calls of ``batch`` images (an exact-seeds engine splits each call per request)."""
    seeds, results, calls = seeds_of(requests), [], []
    i = 0
    while i < len(requests):  # group whole requests up to ``batch`` images, as the batcher does
        j, images = i + 1, requests[i].count
        while j < len(requests) and images + requests[j].count <= batch:
            images += requests[j].count
            j += 1
        calls.append((i, j))
        i = j
    start = time.perf_counter()
    for i, j in calls:
        results += engine.generate(requests[i:j], seeds[i:j])
    seconds = time.perf_counter() - start
    return [pixels(png) for result in results for png in result["pngs"]], seconds


def run_alone(engine: Engine, requests) -> list[np.ndarray]:
    seeds = seeds_of(requests)
    return [pixels(png) for r, s in zip(requests, seeds) for png in engine.generate([r], [s])[0]["pngs"]]


def difference(images: list[np.ndarray], reference: list[np.ndarray]) -> dict:
    d = np.stack([np.abs(a - b) for a, b in zip(images, reference, strict=True)])
    return {
        "images": len(images),
        "values_per_image": int(d[0].size),
        "max_abs": int(d.max()),
        "mean_abs": float(d.mean()),
        "fraction_differing": float((d > 0).mean()),
        "values_differing": int((d > 0).sum()),
        "images_differing": int(sum(bool((x > 0).any()) for x in d)),
    }


def measure(name: str, work: Path, args) -> dict:
    model = model_dir(name, work)
    engines = {
        "exact_off": Engine.load(model, {"p": PROFILE}),
        "exact_on": Engine.load(model, {"p": PROFILE}, exact_seeds=True),
    }
    off = engines["exact_off"]
    requests = make_requests(off, args.requests)
    for engine in engines.values():  # warm-up: applies the profile, first-call costs
        run_batched(engine, requests[: args.batch], args.batch)
    alone = run_alone(off, requests)
    result: dict = {"kind": off.kind, "profile": PROFILE, "guidance": off.default_guidance, "difference": {}}
    first: dict[str, list[np.ndarray]] = {}
    runs: dict[str, list[float]] = {key: [] for key in engines}
    repeatable = {key: True for key in engines}
    for round_ in range(args.rounds):
        order = list(engines) if round_ % 2 == 0 else list(engines)[::-1]
        for key in order:
            images, seconds = run_batched(engines[key], requests, args.batch)
            runs[key].append(len(images) / seconds)
            if key not in first:
                first[key] = images
            else:
                repeatable[key] &= all(np.array_equal(a, b) for a, b in zip(images, first[key]))
        print(
            f"{name} round {round_ + 1}: " + ", ".join(f"{k} {runs[k][-1]:.2f} img/s" for k in runs),
            flush=True,
        )
    for key in engines:
        result["difference"][key] = {
            **difference(first[key], alone),
            "repeatable_over_rounds": repeatable[key],
        }
    # the alone images of the exact engine: the same calls, so the same pixels
    result["alone_same_on_both_engines"] = all(
        np.array_equal(a, b) for a, b in zip(run_alone(engines["exact_on"], requests[: args.batch]), alone)
    )
    counted = make_requests(off, args.batch, count=args.count)
    together = run_alone(off, counted)  # each request alone, its count images in one call
    singles = run_alone(off, [r.model_copy(update={"seed": s, "count": 1}) for r in counted for s in seeds_of([r])[0]])
    result["count"] = {"count": args.count, **difference(together, singles)}
    ratios = [on / off_ for on, off_ in zip(runs["exact_on"], runs["exact_off"])]
    result["throughput"] = {
        "images_per_pass": args.requests,
        "exact_off_images_per_s": runs["exact_off"],
        "exact_on_images_per_s": runs["exact_on"],
        "exact_off_median": statistics.median(runs["exact_off"]),
        "exact_on_median": statistics.median(runs["exact_on"]),
        "on_over_off_median_ratio": statistics.median(ratios),
        "cost_percent": 100 * (1 - statistics.median(ratios)),
    }
    result["load_average_after"] = os.getloadavg()
    return result


def table(out: dict) -> str:
    lines = [
        f"{'model':8} {'exact':6} {'max':>4} {'mean':>9} {'frac':>9} {'imgs≠':>6} {'img/s':>7}",
    ]
    for name, r in out["models"].items():
        for key, label in (("exact_off", "off"), ("exact_on", "on")):
            d, t = r["difference"][key], r["throughput"][f"{key}_median"]
            lines.append(
                f"{name:8} {label:6} {d['max_abs']:>4} {d['mean_abs']:>9.2e} {d['fraction_differing']:>9.2e} "
                f"{d['images_differing']:>3}/{d['images']:<2} {t:>7.2f}"
            )
        c = r["count"]
        lines.append(
            f"{name:8} count={c['count']} vs count=1 (alone): max {c['max_abs']}, "
            f"{c['images_differing']}/{c['images']} images differ; exact-seeds cost "
            f"{r['throughput']['cost_percent']:.0f}% of images/s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["digits", "tiny-sd"], choices=["digits", "tiny-sd"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="images per pipeline call (--max-batch)")
    parser.add_argument("--count", type=int, default=4, help="images per request in the count check")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "seed_repro.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {
        "device": "2-core CPU, 1 thread",
        "date": datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/seed_repro.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "settings": {
            "requests": args.requests,
            "batch": args.batch,
            "count": args.count,
            "rounds": args.rounds,
        },
        "load_average_before": os.getloadavg(),
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="seed-repro-") as work:
        for name in args.models:
            out["models"][name] = measure(name, Path(work), args)
            print(name, json.dumps(out["models"][name]["difference"]), flush=True)
    print(table(out))
    args.out.parent.mkdir(exist_ok=True)
    write_record(args.out, out, benchmark="seed_repro", indent=2)


if __name__ == "__main__":
    main()
