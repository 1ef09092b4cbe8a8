"""Classifier guidance on the digits reference: accuracy/FD vs scale, its cost, and CG vs CFG at equal compute.

Run (one thread, under the heavy-job lock; trains the noise-aware classifier first if it is absent)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/classifier_guidance.py
    .venv/bin/python benchmarks/classifier_guidance.py --render benchmarks/results/classifier_guidance.json

Model: ``.fastdiff-cache/digits`` (the shipped reference if absent); classifier: ``MODEL/noisy_classifier.pt``
(``fastdiff train-classifier MODEL OUT`` defaults). Every call: 500 images (50 per class), DPM++ 2M, seed 0;
accuracy and FD (vs the 360 test images) by the build's evaluation classifier, with each image's requested
class as its label. Unconditional rows run the denoiser on its null class (``unconditional=true``).

Sections (JSON ``benchmarks/results/classifier_guidance.json``):

- ``sweep``: conditional model at guidance 1 (no guidance), unconditional model at classifier scales 0..8, guidance
  windows, the conditional model with classifier guidance; one call each (20 steps).
- ``overhead``: paired rounds of unguided (scale 0) then guided calls of the unconditional model; the extra
  cost is the median over rounds of ``guided / unguided - 1`` (wall and process CPU time).
- ``equal_compute``: classifier-free guidance (conditional + null branch, batch doubled) at ``--cfg-steps``
  against classifier guidance given as many steps as fit in the CFG call's measured time; every config is
  timed in interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fastdiff import FastPipeline
from fastdiff.cli.classifier_guidance import cmd_train_classifier
from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import ensure_digits

DIGITS = Path(__file__).resolve().parents[1] / ".fastdiff-cache" / "digits"
SAMPLER = "scheduler(name=dpm++2m)"
WINDOWS = ((0.0, 0.8), (0.2, 1.0), (0.2, 0.8), (0.4, 1.0))  # guide only for start <= progress < end


def cg(path: str, scale: float, unconditional: bool = True, **window) -> str:
    opts = "".join(f",{k}={v}" for k, v in window.items())
    return f"classifier-guidance(path={path},scale={scale},unconditional={str(unconditional).lower()}{opts})"


class Runner:
    """One FastPipeline, fixed inputs; ``call`` applies specs, samples (seed 0), removes, and evaluates."""

    def __init__(self, model: Path, batch: int):
        self.fp = FastPipeline.from_pretrained(model)
        self.fp.pipe.set_progress_bar_config(disable=True)
        self.inputs = make_inputs(self.fp.pipe, batch, 1.0)
        self.evaluate = quality_for(self.fp.pipe)

    def call(self, specs: str, steps: int, guidance: float = 1.0, quality: bool = True) -> dict:
        handle = self.fp.accelerate(specs)
        call = dict(self.inputs, guidance_scale=guidance, num_inference_steps=steps, output_type="np")
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            images = self.fp(**call, generator=torch.Generator().manual_seed(0)).images
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            handle.remove()
        row = {
            "specs": specs,
            "steps": steps,
            "guidance": guidance,
            "seconds": wall,
            "cpu_seconds": cpu,
            "denoiser_calls": self.fp.context.nfe,
        }
        if quality:
            row.update(self.evaluate(self.fp.pipe, call, np.asarray(images), 0))
        return row


def sweep(runner: Runner, clf: str, steps: int) -> list[dict]:
    configs = [("cond g1", SAMPLER)]
    configs += [(f"uncond cg{s:g}", f"{SAMPLER};{cg(clf, s)}") for s in (0, 1, 2, 3, 4, 6, 8)]
    for start, end in WINDOWS:
        configs.append((f"uncond cg4 [{start},{end})", f"{SAMPLER};{cg(clf, 4, start=start, end=end)}"))
    configs += [(f"uncond cg{s:g} [0.2,1.0)", f"{SAMPLER};{cg(clf, s, start=0.2, end=1.0)}") for s in (3, 5, 6)]
    configs += [(f"cond cg{s:g}", f"{SAMPLER};{cg(clf, s, unconditional=False)}") for s in (1, 2)]
    rows = []
    for name, specs in configs:
        rows.append({"name": name, **runner.call(specs, steps)})
        print(_line(rows[-1]), flush=True)
    return rows


def overhead(runner: Runner, clf: str, steps: int, rounds: int, pick: dict) -> dict:
    """Paired: unguided then guided, per round; extra cost = guided / unguided - 1 (median over rounds)."""
    guided = {f"cg{pick['scale']:g} every step": cg(clf, pick["scale"]), _short(pick): cg(clf, **pick)}
    base = f"{SAMPLER};{cg(clf, 0)}"
    runner.call(base, steps, quality=False)  # warm-up
    out = {}
    for name, spec in guided.items():
        runner.call(f"{SAMPLER};{spec}", steps, quality=False)  # warm-up
        pairs = []
        for _ in range(rounds):
            a = runner.call(base, steps, quality=False)
            b = runner.call(f"{SAMPLER};{spec}", steps, quality=False)
            pairs.append((a["seconds"], b["seconds"], a["cpu_seconds"], b["cpu_seconds"]))
        out[name] = {
            "specs": spec,
            "pairs": pairs,
            "extra_wall": statistics.median(g / u - 1 for u, g, _, _ in pairs),
            "extra_cpu": statistics.median(g / u - 1 for _, _, u, g in pairs),
            "unguided_seconds": statistics.median(p[0] for p in pairs),
            "guided_seconds": statistics.median(p[1] for p in pairs),
        }
        print(f"overhead {name}: wall +{out[name]['extra_wall']:.1%}, CPU +{out[name]['extra_cpu']:.1%}")
    return out


def equal_compute(runner: Runner, clf: str, cfg_steps: list[int], pick: dict, rounds: int) -> list[dict]:
    """CFG at each budget vs classifier guidance with the steps that fit in the CFG call's measured time."""
    configs = []  # (name, specs, steps, guidance_scale, CFG budget in steps)
    for steps in cfg_steps:
        cfg_seconds = runner.call(SAMPLER, steps, guidance=2.0, quality=False)["seconds"]  # also a warm-up
        per_step = runner.call(f"{SAMPLER};{cg(clf, **pick)}", steps, quality=False)["seconds"] / steps
        n = max(1, round(cfg_seconds / per_step))
        configs += [(f"cfg{w:g} {steps} steps", SAMPLER, steps, w, steps) for w in (1.5, 2.0, 3.0)]
        configs.append((f"uncond {_short(pick)} {n} steps", f"{SAMPLER};{cg(clf, **pick)}", n, 1.0, steps))
        configs.append((f"cond cg1 {n} steps", f"{SAMPLER};{cg(clf, 1, unconditional=False)}", n, 1.0, steps))
        configs.append((f"cond g1 {n} steps", SAMPLER, n, 1.0, steps))
    rows = {name: {"name": name, "budget_cfg_steps": budget} for name, *_, budget in configs}
    timings = {name: [] for name, *_ in configs}
    for i in range(rounds):  # interleaved rounds: drift of the machine's speed hits every config alike
        for name, specs, steps, w, _ in configs:
            row = runner.call(specs, steps, guidance=w, quality=i == 0)
            timings[name].append((row["seconds"], row["cpu_seconds"]))
            rows[name].update(row if i == 0 else {})
    for name, row in rows.items():
        row.update(
            timings=timings[name],
            seconds_median=statistics.median(t[0] for t in timings[name]),
            cpu_seconds_median=statistics.median(t[1] for t in timings[name]),
        )
        print(_line(row), flush=True)
    return list(rows.values())


def _short(pick: dict) -> str:
    return f"cg{pick['scale']:g} [{pick['start']},{pick['end']})"


def _line(row: dict) -> str:
    quality = f"acc {row['accuracy']:.1%} FD {row['fd']:.2f}" if "accuracy" in row else ""
    seconds = row.get("seconds_median", row["seconds"])
    return f"{row['name']:<28} steps {row['steps']:>3} g {row['guidance']:<4} {seconds:6.1f} s  {quality}"


def render(result: dict) -> str:
    """Markdown tables of a result JSON: sweep, overhead, equal compute (as in docs/classifier-guidance.md)."""
    head = "| config | steps | CFG scale | accuracy | FD | wall s |\n|---|---|---|---|---|---|"

    def row(r: dict) -> str:
        seconds = r.get("seconds_median", r["seconds"])
        return (
            f"| {r['name']} | {r['steps']} | {r['guidance']:g} | {r['accuracy']:.1%} | {r['fd']:.2f} | {seconds:.1f} |"
        )

    lines = ["### Sweep", head, *map(row, result["sweep"]), "", "### Overhead (paired rounds)"]
    lines += ["| guided config | unguided s | guided s | extra wall | extra CPU |", "|---|---|---|---|---|"]
    for name, o in result["overhead"].items():
        lines.append(
            f"| {name} | {o['unguided_seconds']:.1f} | {o['guided_seconds']:.1f} | "
            f"{o['extra_wall']:+.1%} | {o['extra_cpu']:+.1%} |"
        )
    lines += [
        "",
        "### Equal compute (median of interleaved rounds)",
        head,
        *map(row, result["equal_compute"]),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DIGITS), help="digits build (shipped one installed if absent)")
    parser.add_argument("--classifier", help="default MODEL/noisy_classifier.pt (trained if absent)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scale", type=float, default=4.0, help="the pick: classifier scale ...")
    parser.add_argument("--start", type=float, default=0.2, help="... and window for overhead/equal compute")
    parser.add_argument("--end", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cfg-steps", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default="benchmarks/results/classifier_guidance.json")
    parser.add_argument("--render", metavar="JSON", help="only print the markdown tables of a result file")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    torch.set_num_threads(args.threads)
    model = ensure_digits(args.model)
    clf = Path(args.classifier or model / "noisy_classifier.pt")
    if not clf.is_file():
        cmd_train_classifier(
            SimpleNamespace(
                model=str(model),
                out=str(clf),
                size="bench",
                data=None,
                steps=3000,
                batch_size=128,
                lr=2e-3,
                widths=[16, 32, 64],
                seed=0,
                threads=None,
            )
        )
    report = Path(f"{clf}.json")
    pick = {"scale": args.scale, "start": args.start, "end": args.end}
    runner, load = Runner(model, args.batch), [os.getloadavg()[0]]
    result = {
        "settings": {**vars(args), "sampler": SAMPLER, "classifier": str(clf)},
        "classifier_report": json.loads(report.read_text()) if report.is_file() else None,
        "sweep": sweep(runner, str(clf), args.steps),
        "overhead": overhead(runner, str(clf), args.steps, args.rounds, pick),
        "equal_compute": equal_compute(runner, str(clf), args.cfg_steps, pick, max(1, args.rounds - 1)),
        "load_average": load,
    }
    result["load_average"].append(os.getloadavg()[0])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_record(Path(args.json), result, benchmark="classifier_guidance", indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
