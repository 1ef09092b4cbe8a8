"""Caching on digits-flow or moving-digits: fastdiff's blockcache/forecast against diffusers' own cache hooks.

Every config runs on one loaded pipeline (digits-flow: flow Euler 28 steps; moving-digits: Wan's UniPC 50, pass
``--steps 50``; the model's bench guidance unless --guidance, its bench prompts cycled, one torch thread), interleaved: one untimed warm-up call each on a small batch, then ``--runs`` rounds of one
timed call per config in a rotating order. Per config: process CPU seconds (one thread: the compute cost, far
less disturbed by other processes than wall time), the speedup over the first config, the fraction of steps
whose last transformer block computed its attention (``computed``: the noise-free companion of the timing), and the quality of
the timed call's images or clips (the model's registered scorer: accuracy and FD; moving-digits adds direction
accuracy and temporal consistency) and PSNR against the first config. ``--fd-bootstrap K`` adds each FD's
spread and 95% intervals of FD differences (each row against the first, and ``--compare A:B`` pairs) from K paired
resamples of the images (fastdiff.eval.fd_spread): whether an FD gap is larger than the draw of prompts and seeds.

diffusers' hooks are applied with its ``apply_first_block_cache`` / ``apply_taylorseer_cache`` /
``apply_mag_cache`` (SD3Transformer2DModel is no ``CacheMixin``, so ``enable_cache`` is missing) and removed by
name after each call. StableDiffusion3Pipeline sets no cache context, so this script sets one around every call (the context
``cond`` covers the whole guidance batch, as one transformer call per step carries both branches); WanPipeline sets
its own ("cond" and "uncond", one call each). MagCache
needs ratios calibrated on the model: measured here first with ``MagCacheConfig(calibrate=True)``.

Config syntax (``--config NAME=SETTING``): a fastdiff spec, or ``hf-fbc:THRESHOLD``,
``hf-taylorseer:INTERVAL:WARMUP:ORDER``, ``hf-magcache:THRESHOLD:MAX_SKIP``.

Command::

    .venv/bin/python benchmarks/flow_caching.py --model /work/digits-flow-build/bench --images 500 --runs 2 \\
        --config euler-28=none --config fd-fbc=blockcache(mode=first-block,threshold=0.1) \\
        --config hf-fbc=hf-fbc:0.1

Writes ``benchmarks/results/flow_caching.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.hooks import (
    FirstBlockCacheConfig,
    HookRegistry,
    MagCacheConfig,
    ModelHook,
    TaylorSeerCacheConfig,
    apply_first_block_cache,
    apply_mag_cache,
    apply_taylorseer_cache,
)
from diffusers.hooks.hooks import CacheContext, _set_cache_context

from fastdiff import FastPipeline
from fastdiff.core.hooks import install_hook
from fastdiff.core.inputs import model_prompts, pipeline_directory
from fastdiff.core.tensors import pixels
from fastdiff.eval import quality_for
from fastdiff.eval.bench import ratio_spread
from fastdiff.eval.fd_spread import difference_interval, paired_fd_bootstrap
from fastdiff.eval.fidelity import psnr
from fastdiff.eval.quality import load_reference_eval
from fastdiff.eval.record import write_record

RESULTS = Path(__file__).parent / "results"
STEPS = 28  # set by main: --steps
GUIDANCE = {"scale": 4.0}  # set by main: --guidance, or the model's bench guidance (eval/prompts.json)
CALL: dict = {}  # set by main: the model's bench call (moving-digits: clip size and length)


class Count(ModelHook):
    """Counts the calls of a module (the last block's attention: skipped whenever a cache skips or reuses it)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


class TextPassThrough(ModelHook):
    """SD3's last block returns no text states (``context_pre_only``), which diffusers' FirstBlockCache subtracts
    (diffusers 0.42 fails there); return the block's input text states instead. SD3 discards the text states after
    its last block, so the images are the same as without this hook."""

    def new_forward(self, module, *args, **kwargs):
        text, hidden = self.fn_ref.original_forward(*args, **kwargs)
        if text is None:
            text = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
        return text, hidden


def fbc_on_sd3(transformer, value):
    """Inside diffusers' FirstBlockCache on an SD3 transformer: TextPassThrough on its last block; a handle or None."""
    last = transformer.transformer_blocks[-1] if hasattr(transformer, "transformer_blocks") else None
    if not isinstance(value, FirstBlockCacheConfig) or not getattr(last, "context_pre_only", False):
        return None
    return install_hook(last, TextPassThrough(), "benchmark.text-pass-through")


APPLY = {
    FirstBlockCacheConfig: apply_first_block_cache,
    TaylorSeerCacheConfig: apply_taylorseer_cache,
    MagCacheConfig: apply_mag_cache,
}


def hook_names(module) -> set[str]:
    return {n for m in module.modules() if hasattr(m, "_diffusers_hook") for n in m._diffusers_hook.hooks}


def calibrate_magcache(fp, prompts) -> list[float]:
    """MagCache's per-step magnitude ratios for this model, from one calibration call (diffusers prints them)."""
    config = MagCacheConfig(calibrate=True, num_inference_steps=STEPS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(fp, ("diffusers", config), prompts)
    ratios = re.findall(r"\[([^\]]+)\]", out.getvalue())
    if not ratios:
        raise RuntimeError(f"MagCache calibration printed no ratios: {out.getvalue()[-300:]}")
    return [float(x) for x in ratios[-1].split(",")]


# diffusers' default TaylorSeer patterns (`^blocks.*attn`, full match) miss Wan's attn1/attn2: it would do nothing
WAN_ATTENTION = [r"^blocks\.\d+\.attn[12]"]
TAYLORSEER_IDENTIFIERS: dict = {}  # set by main: {"cache_identifiers": WAN_ATTENTION} on Wan


def setting(text: str, mag_ratios=None):
    """(kind, setting) of a config: ("none", None), ("fastdiff", spec) or ("diffusers", diffusers config)."""
    if text == "none":
        return ("none", None)
    if not text.startswith("hf-"):
        return ("fastdiff", text)
    name, *args = text.split(":")
    if name == "hf-fbc":
        return ("diffusers", FirstBlockCacheConfig(threshold=float(args[0])))
    if name == "hf-taylorseer":
        interval, warmup, order = map(int, args)
        return (
            "diffusers",
            TaylorSeerCacheConfig(
                cache_interval=interval,
                disable_cache_before_step=warmup,
                max_order=order,
                taylor_factors_dtype=torch.float32,
                **TAYLORSEER_IDENTIFIERS,
            ),
        )
    if name == "hf-magcache":
        return (
            "diffusers",
            MagCacheConfig(
                threshold=float(args[0]), max_skip_steps=int(args[1]), num_inference_steps=STEPS, mag_ratios=mag_ratios
            ),
        )
    raise ValueError(f"unknown diffusers config {text!r}; use hf-fbc, hf-taylorseer or hf-magcache")


def last_attention(transformer) -> torch.nn.Module:
    """The attention of the transformer's last block (SD3: ``transformer_blocks``, Wan: ``blocks``' ``attn1``)."""
    blocks = getattr(transformer, "transformer_blocks", None) or transformer.blocks
    return getattr(blocks[-1], "attn", None) or blocks[-1].attn1


def run(fp, config, prompts, seed: int = 0):
    """One call of ``fp`` with ``config`` applied and removed around it: (images, CPU seconds, attention calls)."""
    kind, value = config
    transformer = fp.denoiser
    counter = Count()
    count = install_hook(last_attention(transformer), counter, "benchmark.count")
    handle = fp.accelerate(value) if kind == "fastdiff" else None
    shim = fbc_on_sd3(transformer, value) if kind == "diffusers" else None  # inside diffusers' hooks
    if kind == "diffusers":
        before = hook_names(transformer)
        APPLY[type(value)](transformer, value)
        added = hook_names(transformer) - before
        # diffusers caches the list of child registries at the first context it sets; hooks added since are new
        HookRegistry.check_if_exists_or_initialize(transformer)._child_registries_cache = None
        _set_cache_context(transformer, CacheContext("cond"))
    try:
        start = time.process_time()
        images = pixels(
            fp(
                prompt=prompts,
                guidance_scale=GUIDANCE["scale"],
                num_inference_steps=STEPS,
                output_type="np",
                generator=torch.Generator().manual_seed(seed),
                **CALL,
            )
        )
        seconds = time.process_time() - start
    finally:
        if handle is not None:
            handle.remove()
        if kind == "diffusers":
            _set_cache_context(transformer, None)
            registry = HookRegistry.check_if_exists_or_initialize(transformer)
            for name in added:
                registry.remove_hook(name, recurse=True)
        if shim is not None:
            shim.remove()
        count.remove()
    return images, seconds, counter.calls


def fd_differences(fp, rows: dict, resamples: int, compare: list[str]) -> dict:
    """Each row's FD spread (stored in the row) and FD-difference intervals, from paired resamples of the images."""
    names = list(rows)
    pairs = [(name, names[0]) for name in names[1:]] + [tuple(c.split(":", 1)) for c in compare]
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= set(names):
            raise SystemExit(f"--compare {':'.join(pair)}: both names must be configs ({', '.join(names)})")
    if rows[names[0]]["images"].ndim != 4:
        raise SystemExit("--fd-bootstrap resamples images (N, H, W, C); clips are not supported")
    ref = load_reference_eval(pipeline_directory(fp.pipe))
    spread = paired_fd_bootstrap({n: r["images"] for n, r in rows.items()}, ref, resamples=resamples)
    for name, row in rows.items():
        row["fd_bootstrap_std"] = round(spread["std"][name], 3)
    samples = spread["samples"]
    differences = [
        {
            "a": a,
            "b": b,
            "fd_difference": round(spread["fd"][a] - spread["fd"][b], 3),
            "ci95": [round(x, 3) for x in difference_interval(samples[a], samples[b])],
        }
        for a, b in pairs
    ]
    return {"resamples": resamples, "differences": differences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a digits-flow or moving-digits pipeline directory")
    parser.add_argument("--steps", type=int, default=28, help="28: digits-flow's flow Euler; 50: Wan's UniPC")
    parser.add_argument("--config", action="append", required=True, metavar="NAME=SETTING")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--warmup-images", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "flow_caching.json"))
    parser.add_argument("--guidance", type=float, default=None, help="default: the model's bench guidance")
    parser.add_argument("--fd-bootstrap", type=int, default=0, metavar="K", help="paired FD resamples (images only)")
    parser.add_argument("--compare", action="append", default=[], metavar="A:B", help="FD difference A - B")
    parser.add_argument("--seed", type=int, default=0, help="the images' seed (and the floor's draws)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    global STEPS
    STEPS = args.steps
    from fastdiff.core.inputs import model_call, model_eval_settings
    from fastdiff.zoo.reference_flow import load_flow_pipeline

    fp = FastPipeline(load_flow_pipeline(args.model))  # also loads a Wan pipeline (no null components there)
    GUIDANCE["scale"] = args.guidance or model_eval_settings(fp.pipe).get("guidance", GUIDANCE["scale"])
    CALL.update(model_call(fp.pipe))
    if hasattr(fp.denoiser, "blocks"):
        TAYLORSEER_IDENTIFIERS["cache_identifiers"] = WAN_ATTENTION
    score = quality_for(fp.pipe)
    fp.set_progress_bar_config(disable=True)
    base = model_prompts(fp.pipe)
    prompts = [base[i % len(base)] for i in range(args.images)]
    texts = [c.split("=", 1) for c in args.config]
    mag_ratios = (
        calibrate_magcache(fp, prompts[: args.warmup_images]) if any("hf-magcache" in t for _, t in texts) else None
    )
    configs = {name: setting(text, mag_ratios) for name, text in texts}
    rows = {name: {"name": name, "setting": text, "cpu_seconds": []} for name, text in texts}
    for name, config in configs.items():  # warm-up, and the computed fraction on a small batch
        rows[name]["computed_warmup"] = run(fp, config, prompts[: args.warmup_images])[2]
    names = list(configs)
    for r in range(args.runs):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            images, seconds, computed = run(fp, configs[name], prompts, args.seed)
            row = rows[name]
            row["cpu_seconds"].append(round(seconds, 2))
            row["computed"] = round(computed, 4)
            if r == 0:
                row.update({k: float(v) for k, v in score(fp.pipe, {"prompt": prompts}, images, args.seed).items()})
                row["images"] = images
            print(name, row["cpu_seconds"], row["computed"], row.get("accuracy"), row.get("fd"), flush=True)
    first = rows[names[0]]
    calls, calls_warmup = first["computed"], first["computed_warmup"]
    for row in rows.values():  # attention calls per call against the first config's (no cache: every one)
        row["computed"] = round(row["computed"] / calls, 4)
        row["computed_warmup"] = round(row["computed_warmup"] / calls_warmup, 4)
    for row in rows.values():
        row["cpu_median"] = float(np.median(row["cpu_seconds"]))
        speed = ratio_spread(row["cpu_seconds"], first["cpu_seconds"], baseline=row is first)
        row.update({k: round(v, 3) if isinstance(v, float) else v for k, v in speed.items()})
        row["psnr"] = None if row is first else round(psnr(row["images"], first["images"]), 2)
    spread = fd_differences(fp, rows, args.fd_bootstrap, args.compare) if args.fd_bootstrap else None
    for row in rows.values():
        row.pop("images")
    result = {
        "model": args.model,
        "pipeline": type(fp.pipe).__name__,
        "steps": STEPS,
        "call": CALL,
        "guidance": GUIDANCE["scale"],
        "images": args.images,
        "runs": args.runs,
        "seed": args.seed,
        "threads": 1,
        "mag_ratios": mag_ratios,
        "rows": list(rows.values()),
    }
    if spread:
        result["fd_bootstrap"] = spread
    write_record(Path(args.out), result, benchmark="flow_caching", indent=1)
    print(
        f"{'config':28s} {'cpu s':>8s} {'speedup (range, verdict)':>30s} {'computed':>9s} {'acc':>6s} {'fd':>7s} "
        f"{'fd/floor':>9s} {'psnr':>6s}"
    )
    for row in rows.values():
        ratio = f"{row['speedup']:.2f} ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}, {row['speedup_verdict']})"
        print(
            f"{row['name']:28s} {row['cpu_median']:8.2f} {ratio:>30s} {row['computed']:9.3f} "
            f"{row['accuracy']:6.3f} {row['fd']:7.2f} {row.get('fd_ratio', float('nan')):9.2f} "
            f"{row['psnr'] if row['psnr'] is not None else '-':>6}"
        )
    for d in (spread or {}).get("differences", []):
        print(
            f"FD {d['a']} - {d['b']}: {d['fd_difference']:+.2f}, 95% interval [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
