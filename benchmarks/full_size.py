"""Every accelerator on the full-size zoo models on a CPU, and the timed comparisons at native resolution.

Sections (each writes its part of the JSON as soon as it ends, so a run cut short still reports):

- ``dtype-probe``: fp32 and bf16 matrix-multiply GFLOP/s (a CPU without AVX512-BF16/AMX runs bf16 hundreds of
  times slower, which rules the bf16 matrix out there).
- ``matrix``: on each ``--models`` x ``--dtypes`` pipeline (random weights at the published layouts,
  ``fastdiff.zoo.full_size``), every accelerator of the compatibility matrix (``fastdiff.eval.compat``, plus
  ``quantize(mode=int8-dynamic)``) for ``--steps`` steps at ``--side`` pixels: applied or refused (with the
  reason), finite output, the RSS its ``apply`` holds and the peak RSS the call adds, the latents' relative error
  against the plain call, ``remove()`` giving the plain latents back bit for bit, and the RSS after it (also after
  glibc's ``malloc_trim``: memory the allocator kept but nothing holds).
- ``tome``, ``deepcache``, ``quantize``, ``compile``: SD 1.5 configs side by side on one pipeline, each turned
  on and off around its call, rounds in rotating order; process CPU time per call (median), the ratio against
  no accelerator, and the latents' error against it. tome runs at 512 and 1024 px against tomesd 0.1.3;
  deepcache against the DeepCache package; quantize int8-dynamic and int8-static; compile with inductor.

Commands (one thread per core of the 2-core machine; run alone)::

    python benchmarks/full_size.py --sections matrix --models sd15,dit-xl-2 --dtypes fp32,bf16
    python benchmarks/full_size.py --sections tome,deepcache,quantize,compile --dtypes fp32

Random weights: the figures say what runs, what it costs and how far it moves the output, not image quality.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import inspect
import json
import platform
import statistics
import sys
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np
import psutil
import torch

from fastdiff import FastPipeline
from fastdiff.core.inputs import make_inputs
from fastdiff.core.registry import AcceleratorError
from fastdiff.eval.bench import ratio_spread
from fastdiff.eval.compat import matrix_spec
from fastdiff.eval.record import write_record
from fastdiff.zoo.full_size import make_full_pipeline

RESULTS = Path(__file__).parent / "results" / "full_size_cpu.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MATRIX = (
    "scheduler deepcache blockcache forecast cfg-interval promptcache tome quantize int8-dynamic prune sparsity "
    "lowrank fuse attention vae-tiling compile experts"
).split()
TIMED = ("tome", "deepcache", "quantize", "compile")


class PeakRSS:
    """The highest resident set size seen while the block runs, sampled every 20 ms (bytes above the start)."""

    def __enter__(self):
        self.process, self.start, self.peak, self.done = psutil.Process(), 0, 0, threading.Event()
        self.start = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)
        self.added_gb = (self.peak - self.start) / 2**30


def trimmed_rss_gb() -> float | None:
    """Resident GB after glibc's malloc_trim returns freed heap pages (None without glibc): what is really held."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return psutil.Process().memory_info().rss / 2**30


def resident_gb() -> float:
    """Resident GB, after malloc_trim where glibc offers it."""
    return trimmed_rss_gb() or psutil.Process().memory_info().rss / 2**30


def latents(fp: FastPipeline, inputs: dict) -> tuple[float, np.ndarray]:
    """(process CPU seconds, latents) of one seeded call."""
    start = time.process_time()
    result = fp(**inputs, output_type="latent", generator=torch.Generator().manual_seed(0))
    out = result.frames if hasattr(result, "frames") else result.images  # video pipelines return frames
    seconds = time.process_time() - start
    return seconds, out.float().numpy() if torch.is_tensor(out) else np.asarray(out)  # DiT decodes always


def rel_err(a: np.ndarray, ref: np.ndarray) -> float | None:
    if not (np.isfinite(a).all() and np.isfinite(ref).all()):
        return None
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def spec_of(name: str, pipe) -> str:
    if name == "int8-dynamic":
        return "quantize(mode=int8-dynamic)"
    return matrix_spec(name, pipe)


def matrix_row(fp: FastPipeline, name: str, inputs: dict, plain: np.ndarray) -> dict:
    spec = spec_of(name, fp.pipe)
    row = {"accelerator": name, "spec": spec}
    held_before = resident_gb()
    try:
        with PeakRSS() as applying:
            handle = fp.accelerate(spec)
    except (AcceleratorError, ImportError, NotImplementedError) as exc:
        row.update(status="refused", reason=f"{type(exc).__name__}: {exc}"[:300])
        row["removed_bit_identical"] = bool(np.array_equal(latents(fp, inputs)[1], plain))  # refusing lost nothing
        return row
    row["apply_rss_added_gb"] = resident_gb() - held_before  # what apply holds (its transients trimmed away)
    row["apply_peak_rss_added_gb"] = applying.added_gb  # the most apply needed on the way
    try:
        with PeakRSS() as rss:
            seconds, out = latents(fp, inputs)
        row.update(
            status="ok",
            cpu_s=seconds,
            finite=bool(np.isfinite(out).all()),
            rel_err=rel_err(out, plain),
            peak_rss_added_gb=rss.added_gb,
        )
    except Exception as exc:  # noqa: BLE001 (one failing accelerator must not end the run)
        row.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:300])
    finally:
        handle.remove()
    row["removed_bit_identical"] = bool(np.array_equal(latents(fp, inputs)[1], plain))
    gc.collect()
    row["rss_after_gb"] = psutil.Process().memory_info().rss / 2**30  # grows if a removed accelerator left memory
    row["rss_after_trim_gb"] = trimmed_rss_gb()  # falls back if that memory was only kept by the allocator
    return row


def run_matrix(model: str, dtype: str, args, on_row=None) -> dict:
    """The matrix on one model; ``on_row(entry)`` gets the entry so far after each row (a run killed midway, e.g.
    out of memory, still reports its rows, marked ``partial``)."""
    print(f"matrix {model} {dtype} {args.side} px, {args.steps} steps", flush=True)
    pipe = make_full_pipeline(model, seed=0, dtype=DTYPES[dtype])
    pipe.set_progress_bar_config(disable=True)
    fp = FastPipeline(pipe)
    inputs = {**make_inputs(pipe, 1, side=args.side), "num_inference_steps": args.steps}
    if "num_frames" in inputs or "num_frames" in inspect.signature(pipe.__call__).parameters:
        inputs["num_frames"] = args.frames
    with PeakRSS() as rss:
        seconds, plain = latents(fp, inputs)
    rows = [
        {
            "accelerator": "none",
            "status": "ok",
            "cpu_s": seconds,
            "finite": bool(np.isfinite(plain).all()),
            "peak_rss_added_gb": rss.added_gb,
        }
    ]
    frames = {"frames": inputs["num_frames"]} if "num_frames" in inputs else {}
    head = {"model": model, "dtype": dtype, "side": args.side, "steps": args.steps, **frames}
    for name in args.accelerators:
        if on_row is not None:
            on_row({**head, "partial": f"stopped before {name}", "rows": rows})
        rows.append(matrix_row(fp, name, inputs, plain))
        r = rows[-1]
        shown = (
            r.get("reason", "")[:100]
            if r["status"] != "ok"
            else (
                f"{r['cpu_s']:.1f} s, rel err {r['rel_err']}, +{r['peak_rss_added_gb']:.2f} GB, RSS {r['rss_after_gb']:.1f} GB, trimmed {r['rss_after_trim_gb']}"
            )
        )
        print(f"  {name:14s} {r['status']:8s} {shown}  plain again: {r['removed_bit_identical']}", flush=True)
    fp.unwrap()
    return {**head, "rows": rows}


def timed_configs(section: str, fp: FastPipeline) -> dict:
    """name -> function turning the config on and returning the function that turns it off."""
    pipe = fp.pipe

    def spec(s):
        return lambda: fp.accelerate(s).remove

    def tomesd_on():
        import tomesd

        tomesd.apply_patch(pipe, ratio=0.5)
        return lambda: tomesd.remove_patch(pipe)

    def package_on():
        from DeepCache import DeepCacheSDHelper

        helper = DeepCacheSDHelper(pipe=pipe)
        helper.set_params(cache_interval=3, cache_branch_id=0)
        helper.enable()
        return helper.disable

    none = {"none": lambda: lambda: None}
    return {
        "tome": {**none, "tome(ratio=0.5)": spec("tome(ratio=0.5)"), "tomesd(ratio=0.5)": tomesd_on},
        "deepcache": {
            **none,
            "deepcache(interval=3)": spec("deepcache(interval=3,branch=0)"),
            "DeepCache package (interval 3, branch 0)": package_on,
        },
        "quantize": {
            **none,
            "int8-dynamic": spec("quantize(mode=int8-dynamic)"),
            "int8-static": spec("quantize(mode=int8-static,calibration_batch=1,calibration_steps=2)"),
        },
        "compile": {**none, "compile": spec("compile")},
    }[section]


def run_timed(section: str, side: int, fp: FastPipeline, args) -> dict:
    steps = {"deepcache": 6}.get(section, args.steps)
    guidance = 1.0 if section == "tome" else None  # tome at 1024 px: one branch keeps a call within minutes
    inputs = {**make_inputs(fp.pipe, 1, guidance=guidance, side=side), "num_inference_steps": steps}
    configs = timed_configs(section, fp)
    names, seconds, outs, first = list(configs), {n: [] for n in configs}, {}, {}
    print(f"{section} sd15 {side} px, {steps} steps", flush=True)
    for r in range(args.rounds + 1):  # round 0 warms up (and compiles, and calibrates)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            off = configs[name]()
            try:
                elapsed, outs[name] = latents(fp, inputs)
            finally:
                off()
            (seconds[name] if r else first.setdefault(name, [])).append(elapsed)
    base = statistics.median(seconds["none"])
    rows = []
    for name in names:
        median = statistics.median(seconds[name])
        rows.append(
            {
                "config": name,
                "cpu_s": seconds[name],
                "cpu_s_median": median,
                "first_call_cpu_s": first[name][0],
                **ratio_spread(seconds[name], seconds["none"], "speedup", baseline=name == "none"),
                "rel_err": rel_err(outs[name], outs["none"]),
            }
        )
        print(
            f"  {name:40s} {median:8.2f} s  x{base / median:.2f}  rel err {rows[-1]['rel_err']:.2e}",
            flush=True,
        )
    return {
        "section": section,
        "model": "sd15",
        "side": side,
        "steps": steps,
        "guidance": guidance,
        "rows": rows,
    }


def dtype_probe(threads: int, size: int = 1024) -> dict:
    """Matrix-multiply GFLOP/s in fp32 and bf16: whether this CPU runs bf16 at a usable speed at all."""
    out = {"size": size, "threads": threads}
    for name in ("fp32", "bf16"):
        a = torch.randn(size, size, dtype=DTYPES[name])
        a @ a
        start, n = time.perf_counter(), 0
        while n < 3 or time.perf_counter() - start < 2.0:
            a @ a
            n += 1
        out[f"{name}_gflops"] = 2 * size**3 * n / (time.perf_counter() - start) / 1e9
    print(f"matmul GFLOP/s: fp32 {out['fp32_gflops']:.1f}, bf16 {out['bf16_gflops']:.2f}", flush=True)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default="dtype-probe,matrix," + ",".join(TIMED))
    p.add_argument("--models", default="sd15,dit-xl-2,sdxl,sd35-medium", help="for the matrix")
    p.add_argument("--dtypes", default="fp32,bf16", help="matrix dtypes; the timed sections use the first")
    p.add_argument("--accelerators", default=",".join(MATRIX))
    p.add_argument("--side", type=int, default=256, help="matrix image side (px)")
    p.add_argument("--frames", type=int, default=9, help="matrix clip length of video models")
    p.add_argument("--tome-sides", default="512,1024")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.sections, args.models = args.sections.split(","), args.models.split(",")
    args.dtypes, args.accelerators = args.dtypes.split(","), args.accelerators.split(",")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python benchmarks/full_size.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {
        "commands": [command],
        "date": date.today().isoformat(),
        "device": f"CPU {platform.processor() or platform.machine()}, {args.threads} torch threads",
        "torch": torch.__version__,
        "matrix": [],
        "timed": [],
    }
    if args.out.exists():  # sections of an earlier run with other arguments stay
        old = json.loads(args.out.read_text())
        result["matrix"], result["timed"] = old.get("matrix", []), old.get("timed", [])
        result.update({k: old[k] for k in ("dtype_probe",) if k in old})
        result["commands"] = [c for c in old.get("commands", []) if c != command] + [command]

    def save(key: str, entry: dict, fields: tuple[str, ...]) -> None:  # replaces an earlier entry of the same fields
        result[key] = [e for e in result[key] if any(e.get(f) != entry[f] for f in fields)] + [entry]
        write_record(args.out, result, benchmark="full_size", indent=2)

    if "dtype-probe" in args.sections:
        result["dtype_probe"] = dtype_probe(args.threads)
        write_record(args.out, result, benchmark="full_size", indent=2)
    if "matrix" in args.sections:
        for dtype in args.dtypes:
            for model in args.models:

                def partial(entry: dict) -> None:
                    save("matrix", entry, ("model", "dtype", "side"))

                save("matrix", run_matrix(model, dtype, args, on_row=partial), ("model", "dtype", "side"))
    timed = [s for s in TIMED if s in args.sections]
    if timed:
        pipe = make_full_pipeline("sd15", seed=0, dtype=DTYPES[args.dtypes[0]])
        pipe.set_progress_bar_config(disable=True)
        fp = FastPipeline(pipe)
        for section in timed:
            for side in [int(s) for s in args.tome_sides.split(",")] if section == "tome" else [512]:
                entry = run_timed(section, side, fp, args)
                save("timed", entry, ("section", "side"))
    return result


if __name__ == "__main__":
    main()
