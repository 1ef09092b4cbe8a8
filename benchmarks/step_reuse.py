"""Step reuse side by side: promptcache, cfg-interval and forecast against the plain sampler, one run per model.

Run (1 thread; every ratio comes from configs timed in the same run)::

    .venv/bin/python benchmarks/step_reuse.py --models tiny-sd tiny-dit tiny-sdxl --rounds 3
    .venv/bin/python benchmarks/step_reuse.py --models digits --rounds 2   # .fastdiff-cache/digits (shipped if absent)
    .venv/bin/python benchmarks/step_reuse.py --models digits --rounds 3 --seed 1 \
        --only "deepcache3+cfg-interval(0.0-0.4)" --json benchmarks/results/step_reuse_digits_combined.json

Every model uses DPM++ 2M at 20 steps. The machine is shared and its speed drifts by tens of percent within
minutes, so timing is *paired*: each round times, for every config, one call of ``none`` immediately followed
by one call of the config (each applied, called and removed), and the speedup is the median over rounds of
the pair's ratio (wall clock; ``cpu_speedup`` from this process's CPU time). A warm-up call of every config
comes first. ``promptcache`` gets one untimed call after each apply, so its timed call hits the cache (the
repeated-prompt case). Fidelity (PSNR/SSIM) is against ``none``'s images; the digits model adds classifier
accuracy and FD. Results are merged into ``benchmarks/results/step_reuse.json`` under the model's name (a file
written before the results record format is replaced, not merged).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff import FastPipeline
from fastdiff.core.registry import available
from fastdiff.eval import quality_for
from fastdiff.eval.bench import format_table, make_inputs
from fastdiff.eval.fidelity import psnr, ssim
from fastdiff.eval.provenance import PROVENANCE_KEYS
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits
from fastdiff.zoo.tiny import make_pipeline

DIGITS = Path(__file__).resolve().parents[1] / ".fastdiff-cache" / "digits"
BASE = "scheduler(name=dpm++2m,steps=20)"
WINDOWS = ("cfg-interval(start=0.2,end=0.8)", "cfg-interval(start=0.0,end=0.5)")
FORECASTS = (
    "forecast(order=1,interval=2)",
    "forecast(order=2,interval=2)",  # = order 1 here: a quadratic fit would reach too far (MAX_GAIN)
    "forecast(order=1,interval=3)",
    "forecast(order=2,interval=3)",
    "forecast(order=2,interval=3,warmup=3)",
)
BEST_FORECAST = "forecast(order=2,interval=3,warmup=3)"


def _paired(prefix: str, ratios: list[float]) -> dict:
    """The median of per-round ratios (each round times the baseline and the config back to back) and their range."""
    return {prefix: statistics.median(ratios), f"{prefix}_min": min(ratios), f"{prefix}_max": max(ratios)}


def configs_for(model: str) -> list[tuple[str, str]]:
    """(name, specs) rows for ``model``: only the accelerators that apply to it."""
    rows = [("none", BASE)]
    if model in ("tiny-sd", "tiny-sdxl"):
        rows.append(("promptcache", f"{BASE};promptcache"))
    rows += [(_short(w), f"{BASE};{w}") for w in WINDOWS]
    rows += [(_short(f), f"{BASE};{f}") for f in FORECASTS]
    rows.append((f"{_short(BEST_FORECAST)}+{_short(WINDOWS[1])}", f"{BASE};{BEST_FORECAST};{WINDOWS[1]}"))
    if model == "digits" and "deepcache" in available():
        # The brief's combined target: >= 3x faster than BASE with accuracy within 2 points (guidance 2).
        rows.append(("deepcache3", f"{BASE};deepcache(interval=3)"))
        for w in (*WINDOWS, "cfg-interval(start=0.0,end=0.4)"):
            rows.append((f"deepcache3+{_short(w)}", f"{BASE};deepcache(interval=3);{w}"))
    return rows


def _short(spec: str) -> str:
    name, _, opts = spec.partition("(")
    opts = opts.rstrip(")").replace("start=", "").replace("end=", "-").replace(",", "")
    opts = opts.replace("order=", "o").replace("interval=", "i").replace("warmup=", "w")
    return f"{name}({opts})"


def load(model: str, size: str = "bench") -> FastPipeline:
    if model == "digits":
        return FastPipeline.from_pretrained(ensure_digits(DIGITS))
    return FastPipeline(make_pipeline(model, size))


def bench(fp: FastPipeline, configs, rounds: int, batch: int | None, guidance: float | None, seed: int = 0) -> dict:
    """Paired timing of every config against the first (see the module docstring); ``fastdiff bench`` rows."""
    fp.pipe.set_progress_bar_config(disable=True)
    call = dict(make_inputs(fp.pipe, batch, guidance), output_type="np")
    base_name = configs[0][0]
    wall = {name: [] for name, _ in configs}
    cpu = {name: [] for name, _ in configs}
    ratios = {name: ([], []) for name, _ in configs}  # (wall, cpu) of the adjacent base call / this call
    images, nfe = {}, {}

    def timed(name: str, specs: str) -> tuple[float, float]:
        handle = fp.accelerate(specs)
        try:
            if "promptcache" in specs:
                fp(**call, generator=torch.Generator().manual_seed(seed))  # fills the cache: the timed call hits
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            output = fp(**call, generator=torch.Generator().manual_seed(seed))
            elapsed = time.perf_counter() - start_wall, time.process_time() - start_cpu
        finally:
            handle.remove()
        images[name], nfe[name] = np.asarray(output.images), fp.context.nfe
        return elapsed

    for name, specs in configs:  # warm-up, untimed
        timed(name, specs)
    for _ in range(rounds):
        for name, specs in configs[1:]:
            base, this = timed(base_name, configs[0][1]), timed(name, specs)
            for times, t in ((wall, (base[0], this[0])), (cpu, (base[1], this[1]))):
                times[base_name].append(t[0])
                times[name].append(t[1])
            ratios[name][0].append(base[0] / this[0])
            ratios[name][1].append(base[1] / this[1])
    evaluator = quality_for(fp.pipe)
    reference = images[base_name]
    rows = []
    for name, specs in configs:
        first = name == base_name
        row = {
            "name": name,
            "specs": specs,
            "seconds_median": statistics.median(wall[name]),
            "seconds": wall[name],
            "cpu_s_median": statistics.median(cpu[name]),
            "denoiser_calls": nfe[name],
            **_paired("speedup", [1.0] if first else ratios[name][0]),
            **_paired("cpu_speedup", [1.0] if first else ratios[name][1]),
            "psnr": None if first else psnr(images[name], reference),
            "ssim": None if first else ssim(images[name], reference),
        }
        if evaluator is not None:
            row.update(evaluator(fp.pipe, call, images[name], seed))
        rows.append(row)
    settings = {
        "steps": 20,
        "rounds": rounds,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "batch": len(reference),
        "inputs": {k: v for k, v in call.items() if k not in ("prompt", "class_labels")},
    }
    return {
        "pipeline": type(fp.pipe).__name__,
        "settings": settings,
        "configs": rows,
        "cpu_seconds": cpu,
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny-sd", "tiny-dit", "tiny-sdxl"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", default="bench", choices=["test", "bench"], help="tiny-* model size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=None, help="default: the model's benchmark batch")
    parser.add_argument("--only", nargs="*", default=None, help="config names to run (none is always run)")
    parser.add_argument("--json", default="benchmarks/results/step_reuse.json")
    parser.add_argument("--seed", type=int, default=0, help="generator seed of every call (and the floor's draws)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_path = Path(args.json)
    results = json.loads(out_path.read_text()) if out_path.is_file() else {}
    if "record" not in results:  # a file from before the results record: its rows lack spreads, so none is kept
        results = {}
    # the file's provenance becomes this run's; models an earlier command wrote keep that command's own
    earlier = {key: results.pop(key) for key in (*PROVENANCE_KEYS, "threads", "record", "benchmark") if key in results}
    for section in results.values():
        if isinstance(section, dict) and "command" in earlier and "provenance" not in section:
            section["provenance"] = {key: earlier[key] for key in PROVENANCE_KEYS if key in earlier}
    for model in args.models:
        configs = configs_for(model)
        if args.only:
            configs = [c for c in configs if c[0] == "none" or c[0] in args.only]
        guidance = 2.0 if model == "digits" else None  # digits defaults to 1 (no guidance); SD 7.5, DiT 4
        load_before = os.getloadavg()[0]
        result = bench(load(model, args.size), configs, args.rounds, args.batch, guidance, args.seed)
        result["load_average"] = [load_before, os.getloadavg()[0]]
        result["timing"] = "paired"
        results[model] = result
        print(
            f"\n== {model} (guidance {result['settings']['inputs'].get('guidance_scale')}, "
            f"batch {result['settings']['batch']}, load {load_before:.1f} -> {os.getloadavg()[0]:.1f})"
        )
        print(format_table(result))
        out_path.parent.mkdir(parents=True, exist_ok=True)
        write_record(out_path, results, benchmark="step_reuse")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
