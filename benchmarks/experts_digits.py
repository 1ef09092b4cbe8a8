"""Timestep experts on the digits reference: a pruned and recovered model on the high-noise steps, the full
model on the low-noise ones, against each model alone.

Run (heavy, so under the shared lock; ``build`` is recovery training on all cores, ``bench`` samples on one
thread)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/experts_digits.py build --minutes 22
    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/experts_digits.py bench --runs 3
    .venv/bin/python benchmarks/experts_digits.py table          # markdown of benchmarks/results/experts_digits.json

``build``: the pruned model of ``benchmarks/compress_digits.py`` (``prune(ratio=0.5)``, recovery by
distillation from the full model on the training split, lr 2e-3; ``compress_model``), with as many recovery
steps as fit in ``--minutes`` of this machine: short probe runs measure the seconds per step on 1 thread and
on all cores and the faster is used (``--steps``/``--threads`` fix them instead). The cosine learning-rate
schedule spans the chosen steps. ``compress_digits.py`` uses 10,000 steps of batch 128 (on a GPU); on 2 CPU
cores that is hours, so the default batch here is 64 (more updates for the same time). Writes the model to
``--work`` and the build report to ``benchmarks/results/experts_digits_build.json``.

``bench``: 500 images (labels 0..9 cycling, seed 0), ``--scheduler`` (default dpm++2m, 20 steps), guidance
1 (the model's default), one thread. Configs: the full model, the pruned model, and
``experts(models=PRUNED|self,boundaries=b)`` on the full model for b = 0.25, 0.5, 0.75 (the pruned model on
the first b of the steps: the high noise levels). Each timed run calls every config once, in turn, so they
share the machine's load; after one untimed 2-step warm-up call each, ``--runs`` timed runs; wall and process CPU
seconds are recorded, medians compared. Accuracy, FD and its floor come from the digits quality evaluator
(``quality_for``, as ``fastdiff bench`` uses it) on the last run's images. Writes
``benchmarks/results/experts_digits.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.compress.lowrank import count_params_macs
from fastdiff.compress.recover import MANIFEST, capture_inputs, compress_model, load_compressed, recover
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs, spread
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits

RESULTS = Path(__file__).resolve().parent / "results"
BOUNDARIES = (0.25, 0.5, 0.75)
# as benchmarks/compress_digits.py's "prune" entry, except the number of steps
SPEC, LR, BATCH = "prune(ratio=0.5)", 2e-3, 64


def probe(model: Path, spec: str, lr: float, batch: int, steps: int) -> float:
    """Seconds per recovery step on this machine now (a throwaway pruned copy, ``steps`` after one warm-up)."""
    teacher = FastPipeline.from_pretrained(model)
    student = FastPipeline.from_pretrained(model)
    for fp in (teacher, student):
        fp.pipe.set_progress_bar_config(disable=True)
    student.accelerate(spec)
    recover(student, teacher, str(model), steps=1, lr=lr, batch=batch, progress=False)
    start = time.perf_counter()
    recover(student, teacher, str(model), steps=steps, lr=lr, batch=batch, progress=False)
    return (time.perf_counter() - start) / steps


def build(args) -> None:
    model = ensure_digits(args.model)
    rate, rates = None, {}
    threads = [args.threads] if args.threads else [1, os.cpu_count() or 1]
    if args.steps is None or len(threads) > 1:
        for n in dict.fromkeys(threads):
            torch.set_num_threads(n)
            rates[n] = probe(model, args.spec, args.lr, args.batch, args.probe_steps)
            print(f"probe: {rates[n]:.3f} s/step with {n} threads", flush=True)
        best = min(rates, key=rates.get)
        torch.set_num_threads(best)
        rate = rates[best]
    else:
        torch.set_num_threads(threads[0])
    steps = args.steps or max(1, int(args.minutes * 60 / rate))
    print(f"recovering {steps} steps with {torch.get_num_threads()} threads", flush=True)
    out = Path(args.work) / f"prune-{steps}-lr{args.lr:g}-b{args.batch}"
    started = time.perf_counter()
    if args.rebuild or not (out / MANIFEST).is_file():
        report = compress_model(model, out, args.spec, recover_steps=steps, batch=args.batch, lr=args.lr, resume=True)
    else:
        report = json.loads((out / MANIFEST).read_text())
    build = {
        "model": str(model),
        "out": str(out),
        "specs": args.spec,
        "recover_steps": steps,
        "lr": args.lr,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "probe_seconds_per_step": rate,
        "probe_seconds_per_step_by_threads": rates,
        "minutes_budget": args.minutes if args.steps is None else None,
        "seconds": round(time.perf_counter() - started, 1),
        "recover": report.get("recover"),
        "load_average_1min_at_end": os.getloadavg()[0],
    }
    path = Path(args.build_json)
    write_record(path, build, benchmark="experts_digits", indent=1)
    print(f"built {out} ({steps} steps) in {build['seconds']:.0f} s; report {path}")


def bench(args) -> None:
    model = ensure_digits(args.model)
    pruned = Path(args.pruned or json.loads(Path(args.build_json).read_text())["out"])
    torch.set_num_threads(1)
    configs = {"full": (model, ""), "pruned": (pruned, "")}
    for b in BOUNDARIES:
        configs[f"experts {b:g}"] = (model, f"experts(models={pruned}|self,boundaries={b:g})")
    pipes, rows = {}, {}
    for name, (path, specs) in configs.items():
        fp = load_compressed(path) if path == pruned else FastPipeline.from_pretrained(path)
        fp.pipe.set_progress_bar_config(disable=True)
        fp.accelerate(args.scheduler)
        if specs:
            fp.accelerate(specs)
        pipes[name] = fp
        rows[name] = {
            "specs": ";".join(s for s in (args.scheduler, specs) if s),
            "model": str(path),
            "seconds": [],
            "cpu_seconds": [],
        }
    full_params, full_macs = count_params_macs(pipes["full"].denoiser, capture_inputs(pipes["full"], batch=1))
    pruned_params, pruned_macs = count_params_macs(pipes["pruned"].denoiser, capture_inputs(pipes["pruned"], batch=1))
    call = dict(make_inputs(pipes["full"].pipe, args.images), output_type="np")
    for fp in pipes.values():  # warm-up: first calls at a new batch shape pay one-time costs
        fp(**dict(call, num_inference_steps=2), generator=torch.Generator().manual_seed(0))
    load_start = os.getloadavg()[0]
    outputs = {}
    for run in range(args.runs):
        for name, fp in pipes.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            outputs[name] = fp(**call, generator=torch.Generator().manual_seed(args.seed)).images
            rows[name]["seconds"].append(time.perf_counter() - start)
            rows[name]["cpu_seconds"].append(time.process_time() - start_cpu)
            rows[name]["denoiser_calls"] = fp.context.nfe
        print(
            f"run {run + 1}/{args.runs}: " + ", ".join(f"{n} {r['cpu_seconds'][-1]:.1f}s" for n, r in rows.items()),
            flush=True,
        )
    for name, fp in pipes.items():
        rows[name].update(quality_for(fp.pipe)(fp.pipe, call, outputs[name], args.seed))
    base = rows["full"]
    for row in rows.values():
        row.update(spread(row, base))  # medians, speedups and their spread over the rounds
        row["accuracy_drop_points"] = 100 * (base["accuracy"] - row["accuracy"])
        row["fd_vs_full"] = row["fd"] / base["fd"] - 1
        row["meets_target"] = (
            row["cpu_speedup"] >= 1.5 and row["accuracy_drop_points"] <= 1 and row["fd_vs_full"] <= 0.10
        )
    build_path = Path(args.build_json)
    result = {
        "model": str(model),
        "pruned": str(pruned),
        "images": args.images,
        "seed": args.seed,
        "sampler": args.scheduler,
        "guidance_scale": call.get("guidance_scale"),
        "threads": 1,
        "runs": args.runs,
        "load_average_1min_at_start": load_start,
        "load_average_1min_at_end": os.getloadavg()[0],
        "params": {"full": full_params, "pruned": pruned_params},
        "macs_per_image": {"full": full_macs, "pruned": pruned_macs},
        "build": json.loads(build_path.read_text()) if build_path.is_file() else None,
        "target": "some boundary >= 1.5x faster (CPU seconds) than full, accuracy within 1 point, FD within 10%",
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="experts_digits", indent=1)
    print(table(result))
    print(f"wrote {args.json}")


def table(result: dict) -> str:
    lines = [
        "| config | pruned-model steps | CPU s (median) | speedup (CPU) | accuracy | FD | FD vs full |",
        "|---|---|---|---|---|---|---|",
    ]
    steps = int(result["sampler"].split("steps=")[1].rstrip(")")) if "steps=" in result["sampler"] else None
    for name, r in result["rows"].items():
        if name == "full":
            share = "0"
        elif name == "pruned":
            share = "all"
        else:
            b = float(name.split()[1])
            share = f"{b:.0%}" + (f" ({round(b * steps)} of {steps})" if steps else "")
        lines.append(
            f"| {name} | {share} | {r['cpu_seconds_median']:.1f} | {r['cpu_speedup']:.2f}x | "
            f"{r['accuracy']:.1%} | {r['fd']:.2f} | {r['fd_vs_full']:+.0%} |"
        )
    floor = next(iter(result["rows"].values())).get("fd_floor")
    if floor is not None:
        lines.append(f"\nFD floor (real train vs test images): {floor:.2f}.")
    return "\n".join(lines + ["", verdict(result)])


def verdict(result: dict) -> str:
    """The target (>= 1.5x CPU, accuracy within 1 point, FD within 10%): met by which boundary, or each miss."""
    parts = []
    for name, r in result["rows"].items():
        if not name.startswith("experts"):
            continue
        misses = []
        if r["cpu_speedup"] < 1.5:
            misses.append(f"speed {r['cpu_speedup']:.2f}x < 1.5x")
        if r["accuracy_drop_points"] > 1:
            misses.append(f"accuracy -{r['accuracy_drop_points']:.1f} points > 1")
        if r["fd_vs_full"] > 0.10:
            misses.append(f"FD {r['fd_vs_full']:+.0%} > +10%")
        parts.append(f"{name}: " + ("meets it" if not misses else "misses it (" + "; ".join(misses) + ")"))
    met = any(r["meets_target"] for n, r in result["rows"].items() if n.startswith("experts"))
    return f"Target {'met' if met else 'missed'}: " + "; ".join(parts) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=["build", "bench", "table"])
    parser.add_argument("--model", default=".fastdiff-cache/digits", help="digits reference (installed if absent)")
    parser.add_argument("--work", default="/tmp/fastdiff-experts-digits")
    parser.add_argument("--spec", default=SPEC, help="build: compression specs")
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--batch", type=int, default=BATCH, help="build: recovery batch")
    parser.add_argument("--minutes", type=float, default=22.0, help="build: recovery time budget")
    parser.add_argument("--steps", type=int, default=None, help="build: recovery steps (instead of --minutes)")
    parser.add_argument("--probe-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="build: torch threads (0: probe 1 and all cores)")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--pruned", default=None, help="bench: pruned model dir (default: the build report's)")
    parser.add_argument("--scheduler", default="scheduler(name=dpm++2m,steps=20)")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--build-json", default=str(RESULTS / "experts_digits_build.json"))
    parser.add_argument("--json", default=str(RESULTS / "experts_digits.json"))
    args = parser.parse_args()
    if args.which == "build":
        build(args)
    elif args.which == "bench":
        bench(args)
    else:
        print(table(json.loads(Path(args.json).read_text())))


if __name__ == "__main__":
    main()
