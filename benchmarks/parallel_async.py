"""parallel(mode=async): 2 processes x 1 thread vs 1 process x 1 thread, dpm++2m 20, same seed, with quality.

Run alone on the 2-core machine (both cores are needed), under the shared lock::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/parallel_async.py   # results/parallel_async.json

Models: tiny-sd (bench size, guidance 7.5, 2 prompts; PSNR vs the single-process images) and the digits
reference (guidance 2, 500 images: accuracy and FD by fastdiff's own evaluator, as ``fastdiff bench``, plus
PSNR). Each setting runs in freshly launched worker processes: one untimed warm-up call (it also times the
layers and fixes the stage split), then ``--runs`` timed calls; the speedup is the ratio of median wall times.
``--warmups`` lists the async warm-up lengths to try (the first is the headline); ``--extrapolate both`` runs
each with and without ``extrapolate=1``. ``--interleave`` instead times both arms in one launch, in alternating
rounds (speedup = ratio of the medians; ``round_speedups`` per round). Workers retain freed memory (``launch``);
``--allocator`` also times one process with glibc's default malloc settings (speedup = default / retained,
images must be identical); ``--unpinned`` leaves them unbound to cores. ``--seeds N`` scores the digits
reference on N batches of 500 (seeds 0..N-1, untimed after the first): FD pooled over all of them, and each
batch's own FD (``fd_per_seed``), which shows how much FD over 500 images moves between seeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fastdiff.eval import quality_for
from fastdiff.eval.bench import make_inputs, ratio_spread, time_runs
from fastdiff.eval.fidelity import psnr
from fastdiff.eval.record import write_record
from fastdiff.parallel.group import tensors_of
from fastdiff.parallel.launch import launch
from fastdiff.zoo import build
from fastdiff.zoo.shipped import ensure_digits

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLER = "scheduler(name=dpm++2m,steps=20)"
PIN_CORES: bool | None = None  # launch's default: each CPU worker bound to its own core; --unpinned: False


def timed(rank: int, world: int, model: str, specs: str, call: dict, runs: int, seeds: int = 1) -> dict:
    """On every rank: a warm-up call and ``runs`` timed calls (seed 0), then one call for each further seed;
    rank 0's figures, the images of every seed in order and, for async, the stage plan."""
    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    handle = fp.accelerate(specs)
    seconds, output, _, _ = time_runs(
        lambda: fp(**call, output_type="np", generator=torch.Generator().manual_seed(0)), runs
    )
    images = [output.images] + [
        fp(**call, output_type="np", generator=torch.Generator().manual_seed(seed)).images for seed in range(1, seeds)
    ]
    return {"seconds": seconds, "images": np.concatenate(images), "plan": stage_plan(handle)}


def stage_plan(handle) -> dict:
    """For async: MB exchanged per step, the stage timings and where the cut fell; {} otherwise."""
    states = [h.state for h in getattr(handle, "handles", [handle]) if "state" in h.info]
    plan = {}
    if states:
        st, cut = states[0], states[0].plan

        def megabytes(names):
            return sum(t.numel() * t.element_size() for n in names for t in tensors_of(st.cache[n])) / 2**20

        plan["exchanged_mb_per_step"] = megabytes(cut.send[0])
        plan["stage0_outputs_mb"] = megabytes(cut.units(0))
        plan.update(
            stage_seconds=cut.stage_seconds(),
            boundary=cut.units(1)[0],
            layers_per_stage=[len(cut.units(s)) for s in range(cut.stages)],
            shared_rows={n: round(f, 3) for n, (_, f) in cut.split.items()},
            recuts=len(st.settling.recuts),
        )
    return plan


def interleaved(rank: int, world: int, model: str, specs: str, call: dict, runs: int) -> dict:
    """Both arms in one launch, timed in alternating rounds: rank 0 runs a one-process call (the other rank
    waits at a barrier) and both run the async call; odd rounds go async first. Machine-load drift then hits both
    arms alike (measured here: one process alone varied 22-28 s per tiny-sd call within minutes)."""
    import torch.distributed as dist

    from fastdiff import FastPipeline

    fast = FastPipeline.from_pretrained(model)
    fast.pipe.set_progress_bar_config(disable=True)
    handle = fast.accelerate(specs)
    single = FastPipeline.from_pretrained(model, accelerators=SAMPLER) if rank == 0 else None
    if single is not None:
        single.pipe.set_progress_bar_config(disable=True)

    def one(fp):  # wall seconds and images of one call; only rank 0 runs ``single``, the others wait
        dist.barrier()
        start, images = time.perf_counter(), None
        if fp is not None:
            images = fp(**call, output_type="np", generator=torch.Generator().manual_seed(0)).images
        seconds = time.perf_counter() - start
        dist.barrier()
        return seconds, images

    one(single), one(fast)  # warm-up: the async call also times the layers and fixes the stage split
    seconds: dict[str, list[float]] = {"single": [], "async": []}
    images = {}
    for round_ in range(runs):
        arms = [("single", single), ("async", fast)]
        for arm, fp in arms[:: 1 if round_ % 2 == 0 else -1]:
            took, images[arm] = one(fp)
            seconds[arm].append(took)
    return {"seconds": seconds, "images": images, "plan": stage_plan(handle)}


def async_specs(warmup: int, linear: int, cooldown: int = 0) -> str:
    more = (f",cooldown={cooldown}" if cooldown else "") + (",extrapolate=1" if linear else "")
    return f"{SAMPLER};parallel(mode=async,devices=2,warmup={warmup}{more})"


def measure(
    model: Path,
    call: dict,
    runs: int,
    warmups: list[int],
    evaluate,
    cooldown: int = 0,
    seeds: int = 1,
    extrapolate: tuple[int, ...] = (0,),
    allocator: bool = False,
    interleave: bool = False,
) -> dict:
    if interleave:
        return measure_interleaved(model, call, runs, warmups, evaluate, extrapolate)
    single = launch(timed, 1, str(model), SAMPLER, call, runs, seeds, timeout_s=1200, pin_cores=PIN_CORES)
    out = {"single": {"seconds": single["seconds"], **evaluate(single["images"], None)}}
    if allocator:  # the same process with glibc's default malloc settings (launch(retain_memory=False))
        plain = launch(
            timed, 1, str(model), SAMPLER, call, runs, 1, timeout_s=1200, retain_memory=False, pin_cores=PIN_CORES
        )
        out["single, default malloc"] = {
            "seconds": plain["seconds"],
            **ratio_spread(single["seconds"], plain["seconds"], "speedup"),
            "identical": bool(np.array_equal(plain["images"], single["images"][: len(plain["images"])])),
        }
        print(json.dumps(out["single, default malloc"]), flush=True)
    for warmup, linear in ((w, e) for w in warmups for e in extrapolate):
        specs = async_specs(warmup, linear, cooldown)
        two = launch(timed, 2, str(model), specs, call, runs, seeds, timeout_s=1200, pin_cores=PIN_CORES)
        key = (
            f"async warmup={warmup}"
            + (f" cooldown={cooldown}" if cooldown else "")
            + (" extrapolate=1" if linear else "")
        )
        out[key] = {
            "specs": specs,
            "seconds": two["seconds"],
            **ratio_spread(two["seconds"], single["seconds"], "speedup"),
            **evaluate(two["images"], single["images"]),
            **two["plan"],
        }
        print(json.dumps({k: v for k, v in out[key].items() if k != "specs"}), flush=True)
    return out


def measure_interleaved(model: Path, call: dict, runs: int, warmups: list[int], evaluate, extrapolate) -> dict:
    out = {}
    for warmup, linear in ((w, e) for w in warmups for e in extrapolate):
        specs = async_specs(warmup, linear)
        got = launch(interleaved, 2, str(model), specs, call, runs, timeout_s=1200, pin_cores=PIN_CORES)
        single, two = got["seconds"]["single"], got["seconds"]["async"]
        out[f"interleaved async warmup={warmup}" + (" extrapolate=1" if linear else "")] = row = {
            "specs": specs,
            "single_seconds": single,
            "seconds": two,
            **ratio_spread(two, single, "speedup"),
            "round_speedups": [round(a / b, 3) for a, b in zip(single, two)],
            **evaluate(got["images"]["async"], got["images"]["single"]),
            **got["plan"],
        }
        print(json.dumps({k: v for k, v in row.items() if k != "specs"}), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--fresh", action="store_true", help="start a new JSON instead of adding to it")
    parser.add_argument("--warmups", default="2,3", help="async warm-up lengths, comma-separated")
    parser.add_argument("--models", default="tiny-sd,digits")
    parser.add_argument("--cooldown", type=int, default=0, help="last steps run whole on every rank")
    parser.add_argument(
        "--extrapolate",
        default="off",
        choices=["off", "on", "both"],
        help="async option extrapolate=1 (stale activations carried on to the current timestep)",
    )
    parser.add_argument(
        "--allocator",
        action="store_true",
        help="also time one process with glibc's default malloc (the workers retain freed memory)",
    )
    parser.add_argument("--seeds", type=int, default=1, help="digits: batches of 500 (seeds 0..N-1), FD pooled")
    parser.add_argument(
        "--interleave", action="store_true", help="time both arms in one launch, in alternating rounds (one seed)"
    )
    parser.add_argument("--unpinned", action="store_true", help="workers not bound to cores (launch(pin_cores=False))")
    parser.add_argument("--out", type=Path, default=RESULTS / "parallel_async.json")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    args = parser.parse_args()
    global PIN_CORES
    PIN_CORES = False if args.unpinned else None
    from fastdiff import load_pipeline

    warmups = [int(w) for w in args.warmups.split(",")]
    path = args.out
    out = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    for name in args.models.split(","):
        if name == "tiny-sd":
            model = build("tiny-sd", args.cache / "tiny-sd-bench", size="bench")
        else:
            model = ensure_digits(args.cache / "digits")
        pipe = load_pipeline(model)
        call = make_inputs(pipe, 500 if name == "digits" else 2, 2.0 if name == "digits" else 7.5)
        quality = quality_for(pipe)

        seeds = args.seeds if name == "digits" and not args.interleave else 1
        pooled = {k: v * seeds if k in ("prompt", "class_labels") else v for k, v in call.items()}

        def evaluate(images, reference, pipe=pipe, call=call, pooled=pooled, quality=quality, seeds=seeds):
            row = {} if reference is None else {"psnr_vs_single": psnr(images, reference)}
            if quality is not None:  # the digits reference: accuracy and FD, as fastdiff bench reports them
                row.update(quality(pipe, pooled, images, 0))
                if seeds > 1:  # every batch has the call's own labels
                    batches = np.split(images, seeds)
                    row["fd_per_seed"] = [quality(pipe, call, batch, 0)["fd"] for batch in batches]
            return row

        print(name, flush=True)
        out[name] = {
            **out.get(name, {}),  # runs with other --warmups are kept (each with its own single run)
            "call": {k: v for k, v in call.items() if k not in ("prompt", "class_labels")},
            "images": len(pooled.get("prompt", pooled.get("class_labels", []))),
            "seeds": seeds,
            **measure(
                model,
                call,
                args.runs,
                warmups,
                evaluate,
                args.cooldown,
                seeds,
                {"off": (0,), "on": (1,), "both": (0, 1)}[args.extrapolate],
                args.allocator,
                args.interleave,
            ),
        }
        RESULTS.mkdir(exist_ok=True)
        write_record(path, out, benchmark="parallel_async", indent=2)


if __name__ == "__main__":
    main()
