"""int8 quantization (torchao), compile, fuse and attention backends against the plain model, interleaved.

Suites: ``quantize`` (fp32, int8-dynamic, int8-weight, each with and without ``compile``; int8-static, which
quantizes convolutions too and compiles itself) and ``runtime``
(none, compile, fuse, fuse with channels_last, attention backends math and xformers). Per model, one pipeline
per config (same weights), timed round-robin (each round calls every config once, so load on a shared machine
hits all alike) after an untimed warm-up that also compiles. Reports denoiser parameters, quantized (Linear)
parameters, denoiser megabytes, median wall and CPU seconds, speedups, PSNR against the first config, and the
model's own quality (accuracy, FD on the digits reference).

Commands (one thread; digits: 500 images per call; tiny-sd bench: 1 prompt with CFG; dpm++2m 20 steps)::

    .venv/bin/python benchmarks/quantize.py --threads 1 --runs 3
    .venv/bin/python benchmarks/quantize.py --suite runtime --models tiny-sd --threads 1 --runs 3

Writes ``benchmarks/results/quantize.json`` (``runtime.json`` for the runtime suite).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.compress.quantize import quantizable_linears
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs, ratio_spread
from fastdiff.eval.fidelity import psnr
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits
from fastdiff.zoo.tiny import make_pipeline

SUITES = {
    "quantize": {
        "fp32": "",
        "int8-dynamic": "quantize(mode=int8-dynamic)",
        "int8-weight": "quantize(mode=int8-weight)",
        "compile": "compile",
        "int8-dynamic+compile": "quantize(mode=int8-dynamic);compile",
        "int8-weight+compile": "quantize(mode=int8-weight);compile",
        "int8-static": "quantize(mode=int8-static)",  # convs + linears, PT2E; compiles itself
    },
    "runtime": {
        "none": "",
        "compile": "compile",
        "fuse": "fuse",
        "fuse+channels_last": "fuse(channels_last=true)",
        "attention-math": "attention(backend=math)",
        "attention-xformers": "attention(backend=xformers)",
    },
}


def tensor_bytes(t: torch.Tensor) -> int:
    """Storage bytes of a tensor, torchao subclasses (int8 data + scales) included."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names if isinstance(getattr(t, n), torch.Tensor))
    return t.numel() * t.element_size()


def load(model: str) -> FastPipeline:
    if model == "tiny-sd":
        fp = FastPipeline(make_pipeline("tiny-sd", "bench", seed=0))
    else:
        fp = FastPipeline.from_pretrained(ensure_digits(model) if model.endswith("digits") else model)
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def bench_model(model: str, args) -> dict:
    pipes, rows = {}, {}
    configs = SUITES[args.suite]
    for name in args.configs or list(configs):
        specs = configs[name]
        fp = load(model)
        linear_params = sum(m.weight.numel() for _, m in quantizable_linears(fp.denoiser))
        if "int8-static" in specs:  # convolutions are quantized too
            convs = (torch.nn.Conv2d, torch.nn.Linear)
            linear_params = sum(m.weight.numel() for m in fp.denoiser.modules() if isinstance(m, convs))
        fp.accelerate(";".join(s for s in (args.scheduler, specs) if s))
        pipes[name] = fp
        rows[name] = {
            "name": name,
            "specs": specs,
            "params": sum(p.numel() for p in fp.denoiser.parameters()),
            "quantized_params": linear_params if "quantize" in specs else 0,
            "denoiser_mb": sum(tensor_bytes(t) for t in fp.denoiser.state_dict().values()) / 2**20,
        }
    first = next(iter(pipes.values()))
    inputs = dict(make_inputs(first.pipe), output_type="np")

    def call(fp):
        return fp(**inputs, generator=torch.Generator().manual_seed(args.seed)).images

    images = {}
    for name, fp in pipes.items():  # warm-up (compiles), and the images compared
        start = time.perf_counter()
        images[name] = call(fp)
        rows[name]["first_call_seconds"] = time.perf_counter() - start
        print(f"{model} {name}: first call {rows[name]['first_call_seconds']:.1f} s", flush=True)
    wall = {n: [] for n in pipes}
    cpu = {n: [] for n in pipes}
    for _ in range(args.runs):
        for name, fp in pipes.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call(fp)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base = next(iter(pipes))
    evaluator = quality_for(first.pipe)
    call_kwargs = dict(inputs)
    for name in pipes:
        row = rows[name]
        row["seconds"], row["cpu_seconds"] = wall[name], cpu[name]
        row["seconds_median"], row["cpu_seconds_median"] = (
            statistics.median(wall[name]),
            statistics.median(cpu[name]),
        )
        row.update(ratio_spread(wall[name], wall[base], "speedup", baseline=name == base))
        row.update(ratio_spread(cpu[name], cpu[base], "cpu_speedup", baseline=name == base))
        row["psnr"] = None if name == base else psnr(images[name], images[base])
        if evaluator is not None:
            row.update(evaluator(pipes[name].pipe, call_kwargs, images[name], args.seed))
    return {
        "model": model,
        "inputs": {k: v for k, v in inputs.items() if k not in ("prompt", "class_labels")},
        "batch": len(inputs.get("prompt", inputs.get("class_labels", []))),
        "configs": list(rows.values()),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[".fastdiff-cache/digits", "tiny-sd"])
    parser.add_argument("--suite", choices=list(SUITES), default="quantize")
    parser.add_argument("--configs", nargs="+", help="names within the suite (default: all)")
    parser.add_argument("--scheduler", default="scheduler(name=dpm++2m,steps=20)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="default: benchmarks/results/<suite>.json")
    args = parser.parse_args(argv)
    args.json = args.json or f"benchmarks/results/{args.suite}.json"
    unknown = set(args.configs or ()) - set(SUITES[args.suite])
    if unknown:
        parser.error(
            f"unknown configs {sorted(unknown)} for suite {args.suite}; choose from {list(SUITES[args.suite])}"
        )
    torch.set_num_threads(args.threads)
    result = {"settings": {**vars(args), "load_average_start": os.getloadavg()}, "models": []}
    for model in args.models:
        section = bench_model(model, args)
        result["models"].append(section)
        print(f"\n{model} (batch {section['batch']}, {args.scheduler}, {args.threads} thread(s))")
        for row in section["configs"]:
            extra = "".join(f"  {k} {row[k]:.4g}" for k in ("accuracy", "fd") if isinstance(row.get(k), float))
            psnr_text = "-" if row["psnr"] is None else f"{row['psnr']:.2f} dB"
            print(
                f"  {row['name']:22s} params {row['params'] / 1e6:.2f}M (int8 {row['quantized_params'] / 1e6:.2f}M)"
                f"  {row['denoiser_mb']:.1f} MB  {row['seconds_median']:.2f} s  x{row['speedup']:.2f}"
                f"  (CPU {row['cpu_seconds_median']:.2f} s, x{row['cpu_speedup']:.2f})  PSNR {psnr_text}{extra}"
            )
    result["settings"]["load_average_end"] = os.getloadavg()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="quantize", indent=2)
    return result


if __name__ == "__main__":
    main()
