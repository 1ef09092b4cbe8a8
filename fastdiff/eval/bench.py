"""``fastdiff bench``: configs side by side on one model, same inputs and seeds, speed and quality in one run.

Every config gets one warm-up and ``runs`` timed runs. Fidelity (PSNR/SSIM) is measured against the first
config's images; model-specific quality (accuracy/FD on the digits reference, ODE error on the exact model)
is added where the model has an evaluator.

Example::

    from fastdiff.eval.bench import run_bench
    result = run_bench("/tmp/tiny-sd", [("ddim50", "scheduler(name=ddim,steps=50)"),
                                        ("dpm20", "scheduler(name=dpm++2m,steps=20)")], runs=2)
    print(result["configs"][1]["speedup"], result["configs"][1]["psnr"])
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

# make_inputs and time_runs live in core (every layer uses them); re-exported for the benchmarks and tests
from fastdiff.core.inputs import PROMPTS, default_side, make_inputs, synthetic_image  # noqa: F401
from fastdiff.core.pipeline import FastPipeline
from fastdiff.core.spec import runs_in_process_group
from fastdiff.core.tensors import pixels
from fastdiff.core.timing import peak_rss_mb, time_runs  # noqa: F401
from fastdiff.eval import quality_for
from fastdiff.eval.fidelity import psnr, ssim
from fastdiff.eval.grid import save_grid
from fastdiff.eval.provenance import check_load, load_average, provenance
from fastdiff.eval.record import write_record


def run_bench(
    model: str | Path | FastPipeline,
    configs: list[tuple[str, str]],
    steps: int | None = 20,
    runs: int = 3,
    seed: int = 0,
    threads: int | None = None,
    batch: int | None = None,
    height: int | None = None,
    width: int | None = None,
    guidance: float | None = None,
    json_path: str | Path | None = None,
    quality: bool = True,
    image_dir: str | Path | None = None,
    warmup: bool = True,
    devices: int = 1,
    alternate: bool = True,
    max_load: float | None = None,
    models: dict[str, str | Path | FastPipeline] | None = None,
) -> dict:
    """Run every (name, specs) config with the same inputs and seed; return the results dict (also as JSON).

    With ``devices`` > 1, configs whose specs contain ``parallel(...)`` run in that many worker processes
    (``fastdiff.parallel.launch``, ``threads`` each, default 1); the others run here, with this process's
    malloc set like the workers' (``retain_freed_memory``), so that the ratios are those of the parallelism.

    With ``alternate`` (the default) the configs take turns: ``runs`` rounds, each applying every config in
    order, warming it up and timing one call, then removing it, so that a drift of the machine's speed falls on
    every config alike. Each row records its runs' median, min and max and its ratios' spread; a config whose run
    times overlap the baseline's is "level" (``speedup_verdict``). With ``max_load`` a round refuses to start
    (``LoadError``) while the load average, less this run's threads, is above it. The result carries its
    provenance (command, commit, date, device, threads, load).

    ``models`` maps a config's name to another pipeline it runs on instead (a compressed copy of the same
    model, loaded with ``load_compressed``); the inputs and the quality evaluator stay the main model's.
    """
    if runs <= 0:
        raise ValueError(f"runs must be a positive integer, got {runs}")
    if not configs:
        raise ValueError("give at least one --config NAME=SPECS")
    if devices > 1 and not any(runs_in_process_group(specs) for _, specs in configs):
        raise ValueError(f"devices={devices}, but no config's specs contain parallel(...) to run on them")
    if threads:
        torch.set_num_threads(threads)
    if devices > 1:
        from fastdiff.parallel.launch import retain_freed_memory

        retain_freed_memory()
    fp = model if isinstance(model, FastPipeline) else FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    pipes = {name: _load(m) for name, m in (models or {}).items()}
    unknown = sorted(set(pipes) - {name for name, _ in configs})
    if unknown:
        raise ValueError(f"models names {unknown}, which are not configs: {[name for name, _ in configs]}")
    inputs = make_inputs(fp.pipe, batch, guidance)
    for key, value in (("height", height), ("width", width)):
        if value:
            inputs[key] = value
    evaluator = quality_for(fp.pipe) if quality else None
    rounds, per_round = (runs, 1) if alternate else (1, runs)
    rows: dict[str, dict] = {}
    images_of: dict[str, np.ndarray] = {}
    load_start = load_average()
    bar = tqdm(total=len(configs) * rounds * (per_round + warmup), desc="bench", unit="run")
    for round_index in range(rounds):
        for name, specs in configs:
            check_load(max_load, own_threads=torch.get_num_threads())
            bar.set_postfix_str(name if rounds == 1 else f"{name} (round {round_index + 1}/{rounds})")
            measured = _measure(
                pipes.get(name, fp),
                name,
                specs,
                inputs,
                steps,
                seed,
                per_round,
                warmup,
                devices,
                threads,
                bar,
                evaluator if round_index == 0 else None,
            )
            row = rows.setdefault(
                name, {"name": name, "specs": specs, "seconds": [], "cpu_seconds": [], "peak_rss_mb": 0.0}
            )
            row["seconds"] += measured.pop("seconds")
            row["cpu_seconds"] += measured.pop("cpu_seconds")
            row["peak_rss_mb"] = round(max(row["peak_rss_mb"], measured.pop("peak_rss_mb")), 1)
            if round_index == 0:
                images_of[name] = measured.pop("images")
                row.update(measured)
                if name in pipes:  # the compressed copy this config ran on
                    row["model"] = str(getattr(pipes[name].pipe, "name_or_path", ""))
    bar.close()
    results, reference = [], None
    for name, _ in configs:
        row, images = rows[name], images_of[name]
        if image_dir:
            save_grid(images[:100], Path(image_dir) / f"{_slug(name)}.png", scale=max(1, 128 // images.shape[1]))
        row["psnr"], row["ssim"] = (
            (None, None) if reference is None else (psnr(images, reference), ssim(images, reference))
        )
        reference = images if reference is None else reference
        row.update(spread(row, results[0] if results else row))
        results.append(row)
    out = {
        "model": str(getattr(fp.pipe, "name_or_path", "")),
        "pipeline": type(fp.pipe).__name__,
        "settings": {
            "steps": steps,
            "runs": runs,
            "warmup": warmup,
            "seed": seed,
            "threads": torch.get_num_threads(),
            "devices": devices,
            "alternate": alternate,
            "max_load": max_load,
            "processes": _layout(devices),
            "inputs": {k: v for k, v in inputs.items() if k != "prompt"},
            "batch": _batch(inputs),
        },
        "configs": results,
        **provenance(load_start=load_start),
    }
    if json_path:
        write_record(json_path, out, benchmark="fastdiff bench")
    return out


def _measure(fp, name, specs, inputs, steps, seed, runs, warmup, devices, threads, bar, evaluator) -> dict:
    """Apply ``specs``, time ``runs`` seeded calls (after a warm-up), score them with ``evaluator`` if given,
    remove: the figures of one config in one round."""
    distributed = devices > 1 and runs_in_process_group(specs)
    handle = fp.accelerate(specs) if specs.strip() and not distributed else None
    try:
        call = dict(inputs, output_type="np")
        if steps and "num_inference_steps" not in fp._defaults:
            call["num_inference_steps"] = steps
        if distributed:  # rank 0's timings and images; every rank runs the same seeded calls
            from fastdiff.parallel.run import bench_parallel

            seconds, images, rss, cpu_seconds, nfe = bench_parallel(  # steps unless the specs set them
                fp.pipe.name_or_path,
                specs,
                dict(inputs, output_type="np"),
                devices,
                runs,
                seed,
                warmup,
                threads or 1,
                steps,
            )
            bar.update(runs + int(warmup))
        else:

            def once(call=call):
                return fp(**call, generator=torch.Generator().manual_seed(seed))

            seconds, output, rss, cpu_seconds = time_runs(once, runs, on_run=bar.update, warmup=warmup)
            bar.update(int(warmup))
            images, nfe = np.asarray(pixels(output)), fp.context.nfe
        row = {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "peak_rss_mb": rss,
            "images": images,
            "denoiser_calls": nfe,
        }
        if evaluator is not None:
            row.update(evaluator(fp.pipe, call, images, seed))
        return row
    finally:
        if handle is not None:
            handle.remove()


def _load(model: str | Path | FastPipeline) -> FastPipeline:
    if isinstance(model, FastPipeline):
        fp = model
    else:
        from fastdiff.compress.recover import load_compressed

        fp = load_compressed(model)
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def spread(row: dict, base: dict) -> dict:
    """Medians, min and max of a config's runs; its ratios to ``base`` (median ratio, and the min and max of the
    ratios of runs taken in the same round); "level" where the two configs' run times overlap (with >= 3 runs
    each; fewer give no verdict)."""
    out = {}
    for key, prefix in (("seconds", "speedup"), ("cpu_seconds", "cpu_speedup")):
        mine, theirs = row[key], base[key]
        out[f"{key}_median"] = statistics.median(mine)
        out[f"{key}_min"], out[f"{key}_max"] = min(mine), max(mine)
        out.update(ratio_spread(mine, theirs, prefix, baseline=row is base))
    return out


def ratio_spread(mine: list[float], theirs: list[float], prefix: str = "speedup", baseline: bool = False) -> dict:
    """``theirs`` / ``mine`` run times as ``prefix`` (median ratio), ``prefix_min`` / ``_max`` (ratios of runs of
    the same round) and ``prefix_verdict``: "faster", "slower", or "level" where the runs overlap (>= 3 each)."""
    paired = [b / m for b, m in zip(theirs, mine)]
    out = {
        prefix: statistics.median(theirs) / statistics.median(mine),
        f"{prefix}_min": min(paired),
        f"{prefix}_max": max(paired),
    }
    if baseline:
        out[f"{prefix}_verdict"] = "baseline"
    elif min(len(mine), len(theirs)) < 3:
        out[f"{prefix}_verdict"] = "n/a (< 3 runs)"
    elif min(mine) <= max(theirs) and min(theirs) <= max(mine):
        out[f"{prefix}_verdict"] = "level"
    else:
        out[f"{prefix}_verdict"] = "faster" if max(mine) < min(theirs) else "slower"
    return out


def _layout(devices: int) -> str:
    """What a cross-process ratio compares: "2 processes x 1 thread(s) vs 1 x 1" (threads per process)."""
    threads = torch.get_num_threads()
    if devices <= 1:
        return f"1 process x {threads} thread(s)"
    return f"{devices} processes x {threads} thread(s) for parallel(...) configs vs 1 x {threads} for the others"


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _batch(inputs: dict) -> int:
    for key in ("prompt", "class_labels"):
        if key in inputs:
            return len(inputs[key])
    return int(inputs.get("batch_size", 1))


def format_table(result: dict) -> str:
    """A fixed-width table of a bench result."""
    base = [
        "name",
        "seconds_median",
        "speedup",
        "cpu_speedup",
        "denoiser_calls",
        "peak_rss_mb",
        "psnr",
        "ssim",
    ]
    skip = {
        "specs",
        "seconds",
        "cpu_seconds",
        "cpu_seconds_median",
        "seconds_min",
        "seconds_max",
        "cpu_seconds_min",
        "cpu_seconds_max",
        "cpu_speedup_min",
        "cpu_speedup_max",
        "cpu_speedup_verdict",
    }
    extra = sorted({k for row in result["configs"] for k in row} - set(base) - skip)
    cols = base + extra
    rows = [[_fmt(row.get(c)) for c in cols] for row in result["configs"]]
    header = ["config", "s (median)", "speedup", "CPU speedup", "NFE", "RSS MiB", "PSNR", "SSIM", *extra]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == float("inf"):
            return "inf"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)
