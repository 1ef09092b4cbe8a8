"""The README's digits rows in one run: every accelerator measured on the shipped digits reference against one
baseline, side by side, in alternating rounds.

Run (heavy; ``build`` trains the pruned and low-rank models on all cores, ``bench`` samples on one thread)::

    .venv/bin/python benchmarks/accelerators_digits.py build      # about 25 minutes on 2 CPU cores
    .venv/bin/python benchmarks/accelerators_digits.py bench --runs 3 --max-load 1.5

``build``: ``prune(ratio=0.5)`` recovered for 5000 steps (batch 64, lr 2e-3) and
``lowrank(energy=0.9,targets=all)`` recovered for 1000 steps (batch 128, lr 5e-4), both by distillation from
the shipped model on its training split (``compress_model``), into ``--work``.

``bench``: 500 images (labels 0..9 cycling, seed 0), guidance 1 (the model's default), one thread. DDIM 50
first, then dpm++2m 20 (the sampler every other row uses), then deepcache, int8-static, the pruned and the
low-rank models, and experts (pruned model on the first 75% of the steps). ``run_bench`` alternates the
configs; each row records its ratio to DDIM 50 and, under ``vs_dpm``, to dpm++2m 20, with the rounds' range.
Writes ``benchmarks/results/accelerators_digits.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fastdiff import FastPipeline
from fastdiff.compress.recover import MANIFEST, compress_model, load_compressed
from fastdiff.eval.bench import run_bench, spread
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLER = "scheduler(name=dpm++2m,steps=20)"
# name -> (specs, recovery steps, lr, batch); the pruned model keeps 28% of the weights and needs more training
COMPRESSIONS = {
    "prune": ("prune(ratio=0.5)", 5000, 2e-3, 64),
    "lowrank": ("lowrank(energy=0.9,targets=all)", 1000, 5e-4, 128),
}


def compressed_dir(work: Path, name: str) -> Path:
    _, steps, lr, batch = COMPRESSIONS[name]
    return work / f"{name}-{steps}-lr{lr:g}-b{batch}"


def build(args) -> None:
    model = ensure_digits(args.model)
    torch.set_num_threads(args.threads)
    for name, (spec, steps, lr, batch) in COMPRESSIONS.items():
        out = compressed_dir(Path(args.work), name)
        if (out / MANIFEST).is_file():
            print(f"{name}: {out} already built")
            continue
        started = time.perf_counter()
        compress_model(model, out, spec, recover_steps=steps, batch=batch, lr=lr, resume=True)
        print(f"{name}: built {out} in {time.perf_counter() - started:.0f} s", flush=True)


def bench(args) -> None:
    model = ensure_digits(args.model)
    work = Path(args.work)
    pruned, lowrank = compressed_dir(work, "prune"), compressed_dir(work, "lowrank")
    missing = [str(d) for d in (pruned, lowrank) if not (d / MANIFEST).is_file()]
    if missing:
        raise SystemExit(f"missing compressed models {missing}: run `build` first")
    configs = [
        ("ddim 50", "scheduler(name=ddim,steps=50)"),
        ("dpm++2m 20", SAMPLER),
        ("deepcache 3", f"{SAMPLER};deepcache(interval=3,branch=0)"),
        ("int8-static", f"{SAMPLER};quantize(mode=int8-static)"),
        ("prune 0.5 recovered", SAMPLER),
        ("lowrank 0.9 recovered", SAMPLER),
        ("experts 0.75", f"{SAMPLER};experts(models={pruned}|self,boundaries=0.75)"),
    ]
    result = run_bench(
        model,
        configs,
        steps=None,
        runs=args.runs,
        seed=args.seed,
        threads=1,
        batch=args.images,
        max_load=args.max_load,
        models={"prune 0.5 recovered": pruned, "lowrank 0.9 recovered": lowrank},
    )
    rows = result["configs"]
    sizes = {"prune 0.5 recovered": pruned, "lowrank 0.9 recovered": lowrank}
    for row in rows:  # the denoiser's parameters as the row ran it (the low-rank one factored again)
        fp = load_compressed(sizes[row["name"]]) if row["name"] in sizes else FastPipeline.from_pretrained(model)
        row["params"] = sum(p.numel() for p in fp.denoiser.parameters())
    dpm = next(r for r in rows if r["name"] == "dpm++2m 20")
    for row in rows:
        row["vs_dpm"] = {k: v for k, v in spread(row, dpm).items() if k.startswith(("speedup", "cpu_speedup"))}
    for name in COMPRESSIONS:
        manifest = json.loads((compressed_dir(work, name) / MANIFEST).read_text())
        result.setdefault("compressed", {})[name] = {
            "dir": str(compressed_dir(work, name)),
            "specs": manifest["specs"],
            "recover": manifest["recover"],
        }
    path = Path(args.json)
    write_record(path, result, benchmark="accelerators_digits")
    for row in rows:
        v = row["vs_dpm"]
        print(
            f"{row['name']:24s} {row['accuracy']:.3f} FD {row['fd']:.2f} vs ddim {row['cpu_speedup']:.2f}x "
            f"vs dpm {v['cpu_speedup']:.2f}x [{v['cpu_speedup_min']:.2f}, {v['cpu_speedup_max']:.2f}] "
            f"{v['cpu_speedup_verdict']}"
        )
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--model", default=".fastdiff-cache/digits")
        p.add_argument("--work", default="/tmp/fastdiff-accelerators-digits")
    sub.choices["build"].add_argument("--threads", type=int, default=2)
    b = sub.choices["bench"]
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--images", type=int, default=500)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-load", type=float, default=None)
    b.add_argument("--json", default=str(RESULTS / "accelerators_digits.json"))
    args = parser.parse_args()
    build(args) if args.command == "build" else bench(args)


if __name__ == "__main__":
    main()
