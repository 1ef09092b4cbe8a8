"""The GPU benchmark as one command: full-size SD 1.5 / SDXL / DiT-XL/2, every speed with its quality.

Run on a CUDA machine through ``sh benchmarks/gpu.sh`` (installs the carried wheels first; see docs/gpu.md)::

    python benchmarks/gpu.py                      # writes benchmarks/results/gpu_<device>.json
    python benchmarks/gpu.py --dtypes bf16 --sections matrix --tag bf16 --time-limit 420
    python benchmarks/gpu.py --dry-run --out /tmp/gpu.json   # CPU, tiny models, about two minutes

Each group (one model, dtype, image side and batch) holds its configs side by side: each config has its own
copy of the denoiser (text encoders and VAE are shared), all are warmed up (compiled ones twice), then timed in
rounds, one call of each per round in a rotating order, so drift hits them alike; figures are medians over
rounds. Quality: PSNR of each config's images against the group's ``plain`` images at the same seed.

Sections: ``matrix`` (per model and dtype: raw diffusers, plain = FastPipeline without accelerators, compile,
compile + deepcache, cfg-interval, and in bf16 fp8 + compile), ``tome`` (SD 1.5 at 512 and 1024 px: fastdiff
tome vs tomesd vs none), ``batch`` (SD 1.5 images/s by batch size). Sampler: DPM-Solver++ (2M), 20 steps.
``targets`` lists each goal as {name, value, target, higher_is_better} (+ met, or skipped and why). The JSON is
rewritten after every group, and no group starts past ``--time-limit``, so a run cut short still reports.

``--dry-run`` runs the same code on the CPU with the zoo's tiny test models (tiny-sd, tiny-sdxl, tiny-dit at
32 px; tome at 32 and 48 px), 2 steps, 1 round, batches 1 and 2, with ``compile(backend=eager)``: dynamo traces
the same units, but inductor generates no kernels (too slow on a CPU). fp8 is refused there, and recorded so.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from a hub; set before diffusers is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, package installed or not

from diffusers import DPMSolverMultistepScheduler  # noqa: E402

from benchmarks.gpu_targets import batch_table, quality, relative_error, targets  # noqa: E402
from fastdiff import FastPipeline  # noqa: E402
from fastdiff.core.inputs import make_inputs  # noqa: E402
from fastdiff.core.models import find_denoiser  # noqa: E402
from fastdiff.core.pipeline import NonFiniteOutputError  # noqa: E402
from fastdiff.core.registry import AcceleratorError  # noqa: E402
from fastdiff.core.siblings import sibling  # noqa: E402
from fastdiff.eval.bench import ratio_spread  # noqa: E402
from fastdiff.eval.record import make_record  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NATIVE = {"sd15": 512, "sdxl": 1024, "dit-xl-2": 256, "sd35-medium": 1024}
TINY = {"sd15": "tiny-sd", "sdxl": "tiny-sdxl", "dit-xl-2": "tiny-dit", "sd35-medium": "tiny-sd3"}
TINY_SIDES = {None: 32, 512: 32, 1024: 48}  # dry run: the tiny models' native side, and tome's two sides
UNETS = ("sd15", "sdxl")  # deepcache caches a UNet's deep features
SECTIONS = ("matrix", "tome", "batch")
DEEPCACHE = "deepcache(interval=3,branch=0)"
NOT_A_UNET = "deepcache caches a UNet's deep features; this is a transformer"
NO_TORCHAO = "torchao is not installed (carry a torchao wheel built for this torch)"


@dataclass(frozen=True)
class Config:
    """One way of running a group's pipeline: fastdiff accelerators, the raw pipeline, or tomesd."""

    name: str
    specs: str = ""
    runner: str = "fastdiff"  # "fastdiff" (FastPipeline + specs), "raw" (the diffusers pipeline), "tomesd"
    compiled: bool = False  # warmed up twice (compile, then CUDA graph recording)


@dataclass(frozen=True)
class Group:
    section: str
    model: str  # full-size zoo name (built from its tiny stand-in in a dry run)
    dtype: str
    side: int | None  # image side in pixels; None: the model's native side
    batch: int
    configs: tuple[Config, ...]
    skipped: dict = field(default_factory=dict)  # config name -> why it cannot run here


def configs_by_name(compile_spec: str) -> dict[str, Config]:
    return {
        "raw": Config("raw", runner="raw"),
        "plain": Config("plain"),
        "compile": Config("compile", compile_spec, compiled=True),
        "compile+deepcache": Config("compile+deepcache", f"{DEEPCACHE};{compile_spec}", compiled=True),
        "cfg-interval": Config("cfg-interval", "cfg-interval(start=0.0,end=0.5)"),
        "fp8+compile": Config("fp8+compile", f"quantize(mode=fp8);{compile_spec}", compiled=True),
        "deepcache": Config("deepcache", DEEPCACHE),
        "tome": Config("tome", "tome(ratio=0.5)"),
        "tomesd": Config("tomesd", runner="tomesd"),
    }


def plan(args) -> list[Group]:
    """The groups to run, SD 1.5 first: its fp16 groups carry the overhead, compile, cfg and tome targets."""
    known = configs_by_name(args.compile)
    groups = []
    for dtype in args.dtypes:
        for model in args.models:
            if "matrix" in args.sections:
                names, skipped = ["raw", "plain", "compile", "compile+deepcache", "cfg-interval"], {}
                if model not in UNETS:
                    names.remove("compile+deepcache")
                    skipped["compile+deepcache"] = NOT_A_UNET
                if dtype == "bf16" and importlib.util.find_spec("torchao") is None:
                    skipped["fp8+compile"] = NO_TORCHAO
                elif dtype == "bf16":
                    names.append("fp8+compile")
                groups.append(Group("matrix", model, dtype, None, 1, tuple(known[n] for n in names), skipped))
            if model != "sd15" or dtype != args.dtypes[0]:
                continue
            if "tome" in args.sections:
                tome = tuple(known[n] for n in ("plain", "tome", "tomesd"))
                for side in (TINY_SIDES[512], TINY_SIDES[1024]) if args.dry_run else (512, 1024):
                    groups.append(Group("tome", model, dtype, side, 1, tome))
            if "batch" in args.sections:
                for batch in args.batches:
                    configs = tuple(known[n] for n in args.batch_configs)
                    groups.append(Group("batch", model, dtype, None, batch, configs))
    return groups


def build_base(model: str, dtype: str, args):
    """The group's pipeline on the device, with DPM-Solver++ (2M) as its sampler."""
    if args.dry_run:
        from fastdiff.zoo.tiny import make_pipeline

        pipe = make_pipeline(TINY[model], "test", seed=args.seed).to(DTYPES[dtype])
    else:
        from fastdiff.zoo.full_size import make_full_pipeline

        with torch.device(args.device):  # weights initialized on the GPU: seconds, not minutes
            pipe = make_full_pipeline(model, seed=args.seed, dtype=DTYPES[dtype])
    pipe.to(args.device)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_callers(base, group: Group) -> tuple[dict, dict]:
    """name -> (call(inputs) -> images, FastPipeline or None); and name -> why a config could not be set up."""
    name, denoiser = find_denoiser(base)
    # copies first: FastPipeline hooks a denoiser, and a copy of a hooked one would carry the hooks; from_pipe
    # casts the modules it shares to its torch_dtype (float32 unless told)
    copies = {c.name: copy.deepcopy(denoiser) for c in group.configs if c.name != "plain"}
    twins = {n: sibling(base, torch_dtype=denoiser.dtype, **{name: d}) for n, d in copies.items()}
    twins["plain"] = base
    callers, refused = {}, dict(group.skipped)
    for config in group.configs:
        pipe = twins[config.name]
        pipe.scheduler = copy.deepcopy(base.scheduler)
        pipe.set_progress_bar_config(disable=True)
        if config.runner == "raw":
            callers[config.name] = (lambda inputs, p=pipe: p(**inputs).images, None)
            continue
        if config.runner == "tomesd":
            import tomesd

            tomesd.apply_patch(pipe, ratio=0.5)
        fp = FastPipeline(pipe)
        try:
            if config.specs:
                fp.accelerate(config.specs)
        except (AcceleratorError, ImportError, NotImplementedError) as exc:
            refused[config.name] = f"{type(exc).__name__}: {exc}"[:400]
            continue
        callers[config.name] = (lambda inputs, f=fp: call_checked(f, inputs), fp)
    return callers, refused


def call_checked(fp: FastPipeline, inputs: dict):
    """The images, NaN or not (a non-finite output shows in the quality figure instead of ending the run)."""
    try:
        return fp(**inputs).images
    except NonFiniteOutputError as exc:
        return exc.output.images


def timed(call, inputs: dict, device: str) -> tuple[float, np.ndarray]:
    synchronize(device)
    start = time.perf_counter()
    images = call({**inputs, "generator": torch.Generator().manual_seed(0)})
    synchronize(device)
    elapsed = time.perf_counter() - start
    if isinstance(images, torch.Tensor):  # output_type="latent"
        images = images.float().cpu().numpy()
    return elapsed, np.asarray(images, dtype=np.float32)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def latent_outputs(callers: dict, names: list[str], inputs: dict, device: str) -> dict:
    """One more call per config returning latents: random-weight VAEs saturate many pixels, so images alone can
    hide a difference."""
    latents = {}
    for name in names:
        try:
            latents[name] = timed(callers[name][0], {**inputs, "output_type": "latent"}, device)[1]
        except Exception:  # noqa: BLE001 (the timed rounds already recorded whether this config runs)
            continue
    return latents


def failure(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"[:400]


def run_group(group: Group, base, args, deadline: float) -> dict:
    inputs = make_inputs(base, group.batch, side=group.side)
    inputs.update(num_inference_steps=args.steps, output_type="np")
    callers, refused = make_callers(base, group)
    first, nfe, seconds, images = {}, {}, {}, {}
    for config in group.configs:  # warm-up: compile time and NFE
        if config.name not in callers:
            continue
        call, fp = callers[config.name]
        try:
            for _ in range(2 if config.compiled and not args.dry_run else 1):
                first.setdefault(config.name, timed(call, inputs, args.device)[0])
        except Exception as exc:  # noqa: BLE001 (one failing config, a compile error say, must not end the run)
            refused[config.name] = failure(exc)
            continue
        nfe[config.name] = fp.context.nfe if fp is not None else None
        seconds[config.name] = []
    names = list(seconds)
    for r in range(args.rounds):
        if r and time.monotonic() > deadline:
            break
        for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
            if name in refused:
                continue
            try:
                elapsed, out = timed(callers[name][0], inputs, args.device)
            except Exception as exc:  # noqa: BLE001
                refused[name] = failure(exc)
                continue
            seconds[name].append(elapsed)
            images.setdefault(name, out)
    latents = latent_outputs(callers, [n for n in names if n not in refused], inputs, args.device)
    reference = images.get("plain")
    plain = statistics.median(seconds["plain"]) if seconds.get("plain") else None
    rows = []
    for name in [c.name for c in group.configs] + [n for n in group.skipped if n not in seconds]:
        row = {"name": name, "specs": configs_by_name(args.compile)[name].specs}
        if name in refused or not seconds.get(name):
            reason = refused.get(name, "not timed")
            rows.append(
                {
                    **row,
                    "status": "error" if reason.startswith("error") else "skipped",
                    "reason": reason,
                    "seconds_median": None,
                    "quality": None,
                }
            )
            continue
        median = statistics.median(seconds[name])
        rows.append(
            {
                **row,
                "status": "ok",
                "seconds": seconds[name],
                "seconds_median": median,
                "first_call_s": first[name],
                **(ratio_spread(seconds[name], seconds["plain"], "speedup") if plain else {"speedup": None}),
                "images_per_s": group.batch / median,
                "nfe": nfe[name],
                "quality": {
                    **quality(images[name], reference),
                    "latent_rel_err": relative_error(latents.get(name), latents.get("plain")),
                },
            }
        )
    for _, fp in callers.values():  # leave the base pipeline's denoiser unhooked for the next group's copies
        if fp is not None:
            fp.unwrap()
    return {
        "section": group.section,
        "model": group.model,
        "built_from": TINY[group.model] if args.dry_run else group.model,
        "dtype": group.dtype,
        "side": group.side or (TINY_SIDES[None] if args.dry_run else NATIVE[group.model]),
        "batch": group.batch,
        "rounds": min((len(s) for s in seconds.values()), default=0),
        "configs": rows,
        "paired_plain_over_raw": [p / r for p, r in zip(seconds.get("plain", []), seconds.get("raw", []))],
    }


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu {platform.machine()}"


def slug(name: str) -> str:
    """A file-name-safe device name: "NVIDIA H200" -> "nvidia_h200"."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(make_record(result, "gpu"), indent=2, allow_nan=False))
    tmp.replace(out)


def release(device: str) -> None:
    """Drop the last group's compiled graphs (and CUDA graph pools) and free its memory."""
    torch._dynamo.reset()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def report(label: str, entry: dict) -> None:
    print(label, flush=True)
    for row in entry["configs"]:
        if row["status"] != "ok":
            print(f"  {row['name']:18s} {row['status']}: {row['reason']}")
            continue
        q = row["quality"]
        shown = "identical" if q["identical"] else f"{q['psnr_db'] or float('nan'):.1f} dB"
        shown += f", latents {q['latent_rel_err']:.2e} off" if q.get("latent_rel_err") is not None else ""
        print(
            f"  {row['name']:18s} {row['seconds_median']:8.3f} s  x{row['speedup'] or 0:.2f}  first call "
            f"{row['first_call_s']:.1f} s  PSNR {shown}{'' if q['finite'] else '  NON-FINITE'}",
            flush=True,
        )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny test models, 2 steps, 1 round")
    p.add_argument("--out", type=Path, help="the JSON (default benchmarks/results/gpu_<device>[_TAG].json)")
    p.add_argument("--tag", default="", help="appended to the default JSON name (a run split in parts)")
    p.add_argument("--models", default="sd15,sdxl,dit-xl-2", help=f"of {', '.join(NATIVE)}")
    p.add_argument("--dtypes", default="fp16,bf16", help="of fp16, bf16")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"of {', '.join(SECTIONS)}")
    p.add_argument("--steps", type=int, help="sampler steps (default 20; dry run 2)")
    p.add_argument("--rounds", type=int, help="timed rounds (default 5; dry run 1)")
    p.add_argument("--batches", help="batch sizes of the batch section (default 1,2,4,8; dry run 1,2)")
    p.add_argument("--batch-configs", default="plain,deepcache", help="e.g. plain,deepcache,compile")
    p.add_argument("--compile-mode", default="reduce-overhead", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--time-limit", type=float, default=0, help="start no group after this many seconds (0: none)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for key, allowed in (
        ("models", NATIVE),
        ("dtypes", DTYPES),
        ("sections", SECTIONS),
        ("batch_configs", ("plain", "deepcache", "compile", "compile+deepcache")),
    ):
        setattr(args, key, getattr(args, key).split(","))
        if bad := [v for v in getattr(args, key) if v not in allowed]:
            p.error(f"--{key.replace('_', '-')}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    args.steps = args.steps or (2 if args.dry_run else 20)
    args.rounds = args.rounds or (1 if args.dry_run else 5)
    args.batches = [int(b) for b in (args.batches or ("1,2" if args.dry_run else "1,2,4,8")).split(",")]
    args.device = "cpu" if args.dry_run else "cuda"
    args.compile = "compile(backend=eager)" if args.dry_run else f"compile(mode={args.compile_mode})"
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device here; --dry-run checks the script on the CPU")
    if args.dry_run and args.out is None:
        args.out = Path(tempfile.gettempdir()) / "gpu_dry_run.json"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = time.monotonic()
    deadline = start + args.time_limit if args.time_limit else float("inf")
    device = device_name(args.device)
    out = args.out or RESULTS / f"gpu_{slug(device)}{'_' + slug(args.tag) if args.tag else ''}.json"
    import diffusers

    result = {
        "device": device,
        "dry_run": args.dry_run,
        "settings": {
            "sampler": "dpm++2m",
            "steps": args.steps,
            "rounds": args.rounds,
            "seed": args.seed,
            "compile": args.compile,
            "time_limit_s": args.time_limit,
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "argv": sys.argv[1:] if argv is None else argv,
        },
        "groups": [],
        "not_run": [],
        "targets": [],
        "batch_table": [],
    }
    base_key, base = None, None
    for group in plan(args):
        label = f"{group.section} {group.model} {group.dtype} side={group.side or 'native'} batch={group.batch}"
        if time.monotonic() > deadline:
            result["not_run"].append({"group": label, "reason": f"time limit ({args.time_limit:g} s)"})
            continue
        if base_key != (group.model, group.dtype):
            base = None
            release(args.device)
            built = time.monotonic()
            base, base_key = build_base(group.model, group.dtype, args), (group.model, group.dtype)
            print(f"built {group.model} {group.dtype} in {time.monotonic() - built:.1f} s", flush=True)
        entry = run_group(group, base, args, deadline)
        if args.device.startswith("cuda"):
            entry["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
        release(args.device)
        result["groups"].append(entry)
        report(label, entry)
        result.update(targets=targets(result["groups"]), batch_table=batch_table(result["groups"]))
        result["wall_s"] = time.monotonic() - start
        write(result, out)
    result.update(targets=targets(result["groups"]), batch_table=batch_table(result["groups"]))
    result["wall_s"] = time.monotonic() - start
    write(result, out)
    for target in result["targets"]:
        value = target.get("skipped") if target["value"] is None else f"{target['value']:.3f}"
        print(f"{target['name']}: {value} (target {target['target']}, met: {target['met']})")
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
