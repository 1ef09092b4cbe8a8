"""The README's accelerator table: one row per accelerator, its headline figure read from a results file."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from .format import db, find, fx, pct, rel, spread, table


def _compared(c: dict, base: dict, speed: str, model: str, label: str = "without") -> tuple[str, str, str]:
    """A headline: the speed figure, and the config's accuracy / FD next to its baseline's."""
    quality = f"{pct(c['accuracy'])} / FD {c['fd']:.2f} ({label}: {pct(base['accuracy'])} / {base['fd']:.2f})"
    return speed, quality, model


def _digits(r, name: str) -> dict:
    """A row of the one-run digits table (benchmarks/accelerators_digits.py): every digits row, one baseline."""
    return find(r["accelerators_digits"]["configs"], "name", name)


def _vs_dpm(r, name: str, what: str, label: str = "dpm++2m 20") -> tuple[str, str, str]:
    """A digits row against dpm++2m 20 (the sampler it runs on), its ratio's range over the rounds."""
    c, base = _digits(r, name), _digits(r, "dpm++2m 20")
    return _compared(c, base, f"{spread(c['vs_dpm'], 'cpu_speedup')} {what}", "digits", label)


def h_scheduler(r):
    base, c = _digits(r, "ddim 50"), _digits(r, "dpm++2m 20")
    return _compared(c, base, f"{spread(c, 'cpu_speedup')} vs DDIM 50 (dpm++2m 20)", "digits", "DDIM 50")


def h_schedule(r):
    d = r["schedules_digits"]["bench"]["configs"]
    t, b = find(d, "name", "tuned-4"), find(d, "name", "default-4")
    return (
        "same cost as the default spacing (4 steps)",
        f"FD {t['fd']:.2f} vs {b['fd']:.2f}, {pct(t['accuracy'])} vs {pct(b['accuracy'])}",
        "digits",
    )


def _flow_pick(r, family: str) -> tuple[str, str, str]:
    """A headline of digits-flow's caching run (benchmarks/caching_select.py): the family's pick on seed 0."""
    d = r["flow_caching"]
    c = find(d["rows"], "name", d["selection"]["picks"][family].split("=", 1)[0])
    speed, model = f"{spread(c, 'speedup')} ({c['setting']})", f"digits-flow, picked on seed {d['selection']['seed']}"
    return _compared(c, d["rows"][0], speed, model)


def h_promptcache(r):
    d = r["digits_sd"]["configs"]
    c = find(d, "name", "promptcache")
    return (
        f"{spread(c, 'cpu_speedup')} on one image (saves the text encoder on repeated prompts)",
        f"{db(c['psnr'])} images",
        "digits-sd",
    )


def h_classifier_guidance(r):
    d = r["classifier_guidance"]
    c, u = find(d["sweep"], "name", "uncond cg4 [0.2,1.0)"), find(d["sweep"], "name", "uncond cg0")
    extra = d["overhead"]["cg4 [0.2,1.0)"]["extra_cpu"]
    return (
        f"{rel(extra)} CPU time (scale 4, window 0.2-1)",
        f"{pct(c['accuracy'])} / FD {c['fd']:.2f} from the unconditional model (unguided: {pct(u['accuracy'])})",
        "digits",
    )


def h_quantize(r):
    sd15 = next(t for t in r["full_size_cpu"]["timed"] if t["section"] == "quantize" and t["model"] == "sd15")
    lose = find(sd15["rows"], "config", "int8-static")
    speed, quality, _ = _vs_dpm(r, "int8-static", "(int8-static, x86 CPU, batch 500)", "fp32")
    return (
        f"{speed}; {fx(lose['speedup'])} on SD 1.5 at {sd15['side']} px (one image)",
        quality,
        "digits; SD 1.5 size",
    )


def h_prune(r):
    c = _digits(r, "prune 0.5 recovered")
    share = c["params"] / _digits(r, "dpm++2m 20")["params"]
    return _vs_dpm(r, "prune 0.5 recovered", f"at {share:.0%} of the parameters (ratio 0.5, recovered)", "original")


def _runtime(r, name):
    return find(r["runtime"]["models"][0]["configs"], "name", name)


def h_compile(r):
    cpu = _runtime(r, "compile")
    group = find(r["gpu_nvidia_h200_matrix"]["groups"], "model", "sd15")
    c, plain = find(group["configs"], "name", "compile"), find(group["configs"], "name", "plain")
    low, high = min(plain["seconds"]) / max(c["seconds"]), max(plain["seconds"]) / min(c["seconds"])
    return (
        f"{fx(c['speedup'])} on an H200 against the median uncompiled round ({low:.2f}-{high:.2f}x over the rounds:"
        f" uncompiled {min(plain['seconds']):.2f}-{max(plain['seconds']):.2f} s; `mode=reduce-overhead`, fp16,"
        f" wall time); {fx(cpu['cpu_speedup'])} on a CPU",
        f"PSNR {db(c['quality']['psnr_db'])}, latents {c['quality']['latent_rel_err']:.0e} off",
        "SD 1.5 size (random weights); tiny-sd",
    )


def h_fuse(r):
    c = _runtime(r, "fuse")
    return (f"{spread(c, 'cpu_speedup')}", f"{db(c['psnr'])} images", "tiny-sd")


def h_attention(r):
    c = _runtime(r, "attention-math")
    return (
        f"{spread(c, 'cpu_speedup')} for `backend=math` (the SDPA default is the fast path)",
        f"PSNR {db(c['psnr'])}",
        "tiny-sd",
    )


def h_vae_tiling(r):
    d = r["video_vae"]
    tiled = [rows[1] for rows in d["models"].values()]
    ratios = sorted(row["memory_ratio"] for row in tiled)
    return (
        f"{fx(ratios[0])}-{fx(ratios[-1])} less peak decode memory ({d['frames']} frames, {d['side']} px)",
        f"PSNR {db(min(row['psnr'] for row in tiled))} or more vs untiled",
        f"{len(tiled)} video VAEs",
    )


def h_tiny_vae(r):
    """digits-sd's whole calls (where it loses), and a one-step SD 1.5-size call (where it pays)."""
    speed, quality, model = _pair(r, "tiny_vae_digits_sd", "dpm++2m 4 + tiny-vae", "dpm++2m 4", "digits-sd")
    sd15 = {row["accelerators"] is not None: row["seconds"]["total"] for row in r["tiny_vae_split"]["models"]["sd15"]}
    return (
        f"{speed} on digits-sd; {fx(sd15[False] / sd15[True])} on a one-step call at SD 1.5 size (TAESD's layout, "
        "random weights: speed only)",
        quality,
        f"{model}; SD 1.5 size",
    )


def h_student(r):
    d = r["distill_g2"]["configs"]
    base, c, best = d[0], find(d, "name", "consistency 4"), find(d, "name", "teacher dpm++2m 10")
    return _compared(
        c,
        base,
        f"{spread(_paired(c, base), 'x')} vs DDIM 50 (consistency, 4 steps); {spread(_paired(c, best), 'x')}"
        f" vs the teacher's dpm++2m 10 (FD {best['fd']:.2f}, the fastest plain sampler at DDIM 50's quality)",
        "digits, guidance 2",
        "DDIM 50",
    )


def h_parallel_cfg(r):
    c = r["parallel_cfg"]["digits"]
    return (
        f"{spread(c, 'speedup')} on 2 processes x 1 thread vs 1 x 1 (wall time)",
        "identical images" if not c["max_abs_difference"] else f"max difference {c['max_abs_difference']:.1e}",
        "digits",
    )


def h_parallel_async(r):
    m = r["parallel_async_digits_overlap_seeds"]["digits"]
    c = m["async warmup=2 extrapolate=1"]
    return (
        f"{spread(c, 'speedup')} on 2 processes x 1 thread vs 1 x 1 (wall time, `extrapolate=1`)",
        f"{pct(c['accuracy'])} / FD {c['fd']:.2f} (1 process: {pct(m['single']['accuracy'])} / {m['single']['fd']:.2f})",
        "digits",
    )


def h_parallel_sequence(r):
    rows = [x for x in r["parallel_sequence"]["rows"] if x["output_type"] == "latent"]
    c = max(rows, key=lambda x: x["tokens"])
    return (
        f"{spread(c, 'speedup')} on 2 processes x 1 thread vs 1 x 1 (denoising loop, {c['tokens']} tokens)",
        "identical latents" if not c["max_abs_difference"] else f"max difference {c['max_abs_difference']:.1e}",
        "tiny-wan",
    )


@dataclass(frozen=True)
class Headline:
    spec: str
    what: str
    guide: str
    source: tuple[str, ...]
    figure: Callable[[dict], tuple[str, str, str]] | None


def _paired(c: dict, base: dict) -> dict:
    """``c`` against ``base`` of one ``fastdiff bench`` run as a ``spread`` row: the CPU-time ratio of their medians,
    the range of the ratios of runs taken in the same round, "level" where runs overlap (fewer than 3 runs per
    config: the ratio of their recorded speedups, no range)."""
    mine, theirs = c.get("cpu_seconds") or [], base.get("cpu_seconds") or []
    if min(len(mine), len(theirs)) < 3:  # fastdiff.eval.bench.ratio_spread's rule; the page imports no torch
        return {"x": c["cpu_speedup"] / base["cpu_speedup"]}
    paired = [b / m for b, m in zip(theirs, mine)]
    faster = "faster" if max(mine) < min(theirs) else "slower"
    verdict = "level" if min(mine) <= max(theirs) and min(theirs) <= max(mine) else faster
    return {"x": median(theirs) / median(mine), "x_min": min(paired), "x_max": max(paired), "x_verdict": verdict}


def _pair(r, source: str, name: str, base_name: str, model: str) -> tuple[str, str, str]:
    """Config ``name`` of a ``fastdiff bench`` file against config ``base_name`` of the same run (``_paired``)."""
    configs = r[source]["configs"]
    c, base = find(configs, "name", name), find(configs, "name", base_name)
    return _compared(c, base, f"{spread(_paired(c, base), 'x')}, {name} vs {base_name}", model, base_name)


def _figure(name: str | None) -> Callable[[dict], tuple[str, str, str]] | None:
    """``h_NAME`` of this module, ``flow_pick:FAMILY`` (digits-flow's caching pick for that family),
    ``pair:SOURCE:NAME:BASE:MODEL`` (two configs of one ``fastdiff bench`` file), or ``digits:NAME:WHAT:LABEL``
    (a row of the one-run digits table against its dpm++2m 20, the baseline called LABEL)."""
    if name is None:
        return None
    if name.startswith("digits:"):
        config, what, label = name.split(":")[1:]
        return functools.partial(_vs_dpm, name=config, what=what, label=label)
    if name.startswith("pair:"):
        source, config, base, model = name.split(":")[1:]
        return functools.partial(_pair, source=source, name=config, base_name=base, model=model)
    if name.startswith("flow_pick:"):
        return functools.partial(_flow_pick, family=name.split(":", 1)[1])
    return globals()[name]


# What each row is (spec, description, guide, source files) is data: headlines.json; its figure is code here.
HEADLINES = [
    Headline(e["spec"], e["what"], e["guide"], tuple(e["source"]), _figure(e["figure"]))
    for e in json.loads(Path(__file__).with_name("headlines.json").read_text())
]


def accelerators_block(results: dict[str, Any], docs_prefix: str) -> str:
    rows = []
    for h in HEADLINES:
        if h.figure and all(s in results for s in h.source):
            speed, quality, model = h.figure(results)
        else:
            speed, quality, model = "not measured", "-", "-"
        rows.append((h, speed, quality, model))
    return table(
        [
            ("spec", lambda r: f"`{r[0].spec}`"),
            ("what it does", lambda r: r[0].what),
            ("measured", lambda r: r[1]),
            ("quality (accuracy / FD, or PSNR)", lambda r: r[2]),
            ("model", lambda r: r[3]),
            ("guide", lambda r: f"[{r[0].guide.removesuffix('.md')}]({docs_prefix}{r[0].guide})"),
        ],
        rows,
    )
