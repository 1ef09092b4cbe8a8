"""The full-size models' files: the GPU benchmark (``benchmarks/gpu.py``: configs side by side, and the targets)
and every accelerator on a CPU (``benchmarks/full_size.py``)."""

from __future__ import annotations

from .format import code, db, fx, sec, table
from .section import GROUPS, Section


def _quality(row: dict) -> str | None:
    q = row.get("quality")
    if not q:
        return None
    if q.get("identical"):
        return "identical"
    latent = q.get("latent_rel_err")
    image = db(q.get("psnr_db"))
    return f"{image}; latents {latent:.1e} off" if latent is not None else image


def r_gpu(d: dict) -> str:
    rows = [
        {**c, "group": f"{g['model']} {g['dtype']}, {g['side']} px, batch {g['batch']} ({g['section']})"}
        for g in d["groups"]
        for c in g["configs"]
    ]
    timings = table(
        [
            ("group", lambda r: r["group"]),
            ("config", lambda r: r["name"]),
            ("specs", lambda r: code(r.get("specs"))),
            ("s per call (median)", lambda r: sec(r.get("seconds_median")) or r.get("reason", "")[:90]),
            ("speedup vs plain", lambda r: fx(r.get("speedup"))),
            ("first call, s", lambda r: sec(r.get("first_call_s"))),
            ("quality vs plain (image PSNR; latent error)", _quality),
        ],
        rows,
    )
    goals = table(
        [
            ("goal", lambda t: t["name"]),
            ("value", lambda t: f"{t['value']:.3g}" if isinstance(t.get("value"), (int, float)) else "-"),
            ("target", lambda t: ("<= " if not t["higher_is_better"] else ">= ") + f"{t['target']:g}"),
            (
                "met",
                lambda t: {True: "yes", False: "no"}.get(t.get("met"), t.get("skipped", "not measured")[:80]),
            ),
        ],
        d["targets"],
    )
    s = d["settings"]
    return (
        f"{timings}\n\n{goals}\n\nSampler {s['sampler']}, {s['steps']} steps, medians over {s['rounds']} rounds of "
        f"one call per config in rotating order; torch {s['torch']}, diffusers {s['diffusers']}. Random weights: "
        "image PSNR compares saturated pixels, the latent error (relative L2 against plain) is the sharper figure."
    )


def _err(v) -> str | None:
    return None if v is None else ("0 (identical)" if v == 0 else f"{v:.1e}")


def _gb(key: str):
    return lambda r: None if r.get(key) is None else f"{r[key]:.2f}"


def _memory_columns(rows: list[dict]) -> list:
    """What apply holds and what stays after remove() (with and without the allocator's free pages), if recorded."""
    if not any("apply_rss_added_gb" in r for r in rows):
        return []
    peak = [("peak during apply, GB", _gb("apply_peak_rss_added_gb"))] if any(
        "apply_peak_rss_added_gb" in r for r in rows
    ) else []  # fmt: skip
    return peak + [
        ("held by apply, GB", _gb("apply_rss_added_gb")),
        ("RSS after remove(), GB", _gb("rss_after_gb")),
        ("same after malloc_trim, GB", _gb("rss_after_trim_gb")),
    ]


def r_full_size_cpu(d: dict) -> str:
    parts = []
    checks = [dict(m, check=True) for m in d.get("memory_checks", [])]
    for m in d.get("matrix", []) + checks:
        rows = table(
            [
                ("accelerator", lambda r: code(r.get("spec")) or r["accelerator"]),
                (
                    "status",
                    lambda r: (
                        r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:110]}"
                    ),
                ),
                ("CPU s", lambda r: sec(r.get("cpu_s"))),
                ("latent error vs none", lambda r: _err(r.get("rel_err"))),
                ("finite", lambda r: {True: "yes", False: "NO"}.get(r.get("finite"))),
                ("peak RSS added, GB", _gb("peak_rss_added_gb")),
                (
                    "after remove()",
                    lambda r: {True: "bit-identical", False: "DIFFERS"}.get(r.get("removed_bit_identical")),
                ),
            ]
            + _memory_columns(m["rows"]),
            m["rows"],
        )
        frames = f", {m['frames']} frames" if m.get("frames") else ""
        cut = f" (run cut short: {m['partial']})" if m.get("partial") else ""
        check = " (memory check: these accelerators only)" if m.get("check") else ""
        check += f" ({m['composed']})" if m.get("composed") else ""
        parts.append(
            f"**{m['model']}, {m['dtype']}, {m['side']} px{frames}, {m['steps']} steps{cut}{check}**\n\n{rows}"
        )
    for t in d.get("timed", []):
        rows = table(
            [
                ("config", lambda r: r["config"]),
                ("CPU s per call (median)", lambda r: sec(r["cpu_s_median"])),
                ("speedup", lambda r: fx(r["speedup"])),
                ("first call, CPU s", lambda r: sec(r.get("first_call_cpu_s"))),
                ("latent error vs none", lambda r: _err(r.get("rel_err"))),
            ],
            t["rows"],
        )
        guidance = "no guidance" if t.get("guidance") == 1.0 else "the pipeline's guidance"
        parts.append(
            f"**{t['section']}: {t['model']}, {t['side']} px, {t['steps']} steps, {guidance}**\n\n{rows}"
        )
    probe = d.get("dtype_probe")
    if probe:
        parts.append(
            f"Matrix multiply ({probe['size']} x {probe['size']}, {probe['threads']} threads) on this CPU: "
            f"fp32 {probe['fp32_gflops']:.1f} GFLOP/s, bf16 {probe['bf16_gflops']:.2f} GFLOP/s "
            f"({probe['fp32_gflops'] / probe['bf16_gflops']:.0f}x slower: no AVX512-BF16 or AMX). "
            + (
                "So the bf16 matrices here run at a small side and one step: whether each accelerator runs in bf16"
                " and gives the plain output back, not its speed."
                if any(m["dtype"] == "bf16" for m in d.get("matrix", []))
                else "A bf16 matrix of the full-size models would take that much longer here, so bf16 is left to"
                " the GPU run."
            )
        )
    return "\n\n".join(parts) + (
        "\n\nLatent error: relative L2 distance of the final latents from the same call without the accelerator "
        "(random weights: how far the output moves, not image quality)."
    )


SECTIONS: dict[str, Section] = {
    "full_size_cpu": Section(
        GROUPS[-1],
        "Every accelerator at full size, on a CPU",
        "`benchmarks/full_size.py`",
        "The full-size zoo models (random weights) with every accelerator: runs or is refused, finite output, memory, "
        "exact removal; and SD 1.5 comparisons side by side at native resolution.",
        r_full_size_cpu,
    ),
}
SECTIONS |= {
    stem: Section(GROUPS[-1], title, "`benchmarks/gpu.py`", what, r_gpu)
    for stem, title, what in [
        (
            "gpu_nvidia_h200_sd15",
            "Real sizes on an H200: SD 1.5, matrix, tome and batch",
            "SD 1.5 (860M UNet, random weights) in fp16 at 512 px (tome also at 1024 px), one call per config per round.",
        ),
        (
            "gpu_nvidia_h200_matrix",
            "Real sizes on an H200: SD 1.5 and DiT-XL/2, 11 rounds",
            "The matrix section again on SD 1.5 (512 px) and DiT-XL/2 (256 px) in fp16, with more rounds.",
        ),
    ]
}


def real_sizes_block(results: dict) -> str:
    """The README's "real sizes" table: one row per full-size comparison measured (CPU and GPU)."""
    rows = []
    cpu = results.get("full_size_cpu", {})
    for m in cpu.get("matrix", []):
        by_status = {s: [r for r in m["rows"][1:] if r["status"] == s] for s in ("ok", "refused", "error")}
        exact = all(r["removed_bit_identical"] for r in m["rows"][1:] if "removed_bit_identical" in r)
        cut = f" (cut short: {m['partial']})" if m.get("partial") else ""
        rows.append((f"{len(m['rows']) - 1} accelerators, {m['steps']} steps at {m['side']} px{cut}", f"{m['model']} {m['dtype']}, CPU",
                     f"{len(by_status['ok'])} run, {len(by_status['refused'])} refused with a reason, "
                     f"{len(by_status['error'])} failed", "plain output again after each" if exact else "NOT exact"))  # fmt: skip
    for t in cpu.get("timed", []):
        base = t["rows"][0]
        for r in t["rows"][1:]:
            rows.append((f"`{r['config']}`" if "(" in r["config"] else r["config"], f"{t['model']} {t['side']} px, {t['steps']} step{'s' if t['steps'] > 1 else ''}, CPU",
                         f"{fx(r['speedup'])} CPU time vs {base['config']}", f"latents {_err(r['rel_err'])} off"))  # fmt: skip
    gpu = results.get("gpu_nvidia_h200_matrix")
    for g in gpu["groups"] if gpu else []:
        for r in g["configs"]:
            if r["name"] in ("compile", "compile+deepcache") and r["status"] == "ok":
                rows.append((f"`{r['specs']}`", f"{g['model']} {g['dtype']} {g['side']} px, H200",
                             f"{fx(r['speedup'])} wall time vs plain", f"latents {_err(r['quality']['latent_rel_err'])} off"))  # fmt: skip
    return table(
        [("what", lambda r: r[0]), ("model, device", lambda r: r[1]), ("measured", lambda r: r[2]),
         ("output", lambda r: r[3])],
        rows,
    )  # fmt: skip
