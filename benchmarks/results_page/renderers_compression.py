"""Compression (token merging, quantization, pruning, low rank) and timestep experts: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, pct, r_bench, rel, sec, table
from .section import GROUPS, Section


def r_tome(d: dict) -> str:
    out = table(
        [
            ("config", lambda c: c["name"]),
            ("CPU s (median)", lambda c: sec(c.get("cpu_seconds_median"))),
            ("CPU speedup", lambda c: fx(c.get("cpu_speedup"))),
            ("wall speedup", lambda c: fx(c.get("speedup"))),
            ("PSNR vs none", lambda c: db(c.get("psnr"))),
        ],
        d["configs"],
    )
    return out + (
        f"\n\nfastdiff `tome` vs `tomesd`: {fx(d.get('tome_vs_tomesd_cpu_time_ratio'), 3)} (ratio of CPU medians),"
        f" {fx(d.get('tome_vs_tomesd_paired_cpu_ratio'), 3)} (median of paired per-run ratios);"
        f" PSNR difference {d.get('tome_minus_tomesd_psnr_db', 0):+.2f} dB."
    )


def r_quantize(d: dict) -> str:
    def render(m):
        return table(
            [
                ("config", lambda c: c["name"]),
                ("specs", lambda c: code(c.get("specs"))),
                (
                    "quantized parameters",
                    lambda c: f"{c['quantized_params']:,} of {c['params']:,}" if "params" in c else None,
                ),
                ("CPU s (median)", lambda c: sec(c.get("cpu_seconds_median"))),
                ("CPU speedup", lambda c: fx(c.get("cpu_speedup"))),
                ("wall speedup", lambda c: fx(c.get("speedup"))),
                ("first call s", lambda c: sec(c.get("first_call_seconds"))),
                ("PSNR vs fp32", lambda c: db(c.get("psnr"))),
                ("accuracy", lambda c: pct(c.get("accuracy"))),
                ("FD", lambda c: num(c.get("fd"))),
            ],
            m["configs"],
        )

    parts = []
    for m in d["models"]:
        g = m.get("inputs", {}).get("guidance_scale")
        parts.append(f"**{m['model']}** (batch {m.get('batch')}, guidance {g:g})\n\n{render(m)}")
    return "\n\n".join(parts)


def r_compress(d: dict) -> str:
    base = d["rows"].get("original", {})
    return (
        table(
            [
                ("model", lambda kv: kv[0]),
                ("params", lambda kv: f"{kv[1]['params']:,} ({kv[1]['params'] / base['params']:.1%})"),
                (
                    "MACs / image",
                    lambda kv: (
                        f"{kv[1]['macs_per_image'] / 1e6:.1f}M ({kv[1]['macs_per_image'] / base['macs_per_image']:.1%})"
                    ),
                ),
                (
                    "recovery steps (device)",
                    lambda kv: (
                        f"{kv[1]['recover']['steps']:,} ({kv[1]['recover']['device']})"
                        if kv[1].get("recover") and kv[1]["recover"]["steps"]
                        else "none"
                    ),
                ),
                ("CPU s (median)", lambda kv: sec(kv[1].get("cpu_seconds_median"))),
                ("CPU speedup", lambda kv: fx(kv[1].get("cpu_speedup"))),
                ("wall speedup", lambda kv: fx(kv[1].get("speedup"))),
                ("accuracy", lambda kv: pct(kv[1].get("accuracy"))),
                ("FD", lambda kv: num(kv[1].get("fd"))),
            ],
            list(d["rows"].items()),
        )
        + f"\n\nSampler {code(d.get('sampler'))}, {d.get('images')} images, {d.get('threads')} thread(s), {d.get('runs')} runs."
    )


def r_experts(d: dict) -> str:
    return (
        table(
            [
                ("config", lambda kv: kv[0]),
                ("CPU s (median)", lambda kv: sec(kv[1].get("cpu_seconds_median"))),
                ("CPU speedup", lambda kv: fx(kv[1].get("cpu_speedup"))),
                ("accuracy", lambda kv: pct(kv[1].get("accuracy"))),
                ("FD", lambda kv: num(kv[1].get("fd"))),
                ("FD vs full", lambda kv: rel(kv[1].get("fd_vs_full"))),
                ("meets target", lambda kv: "yes" if kv[1].get("meets_target") else "no"),
            ],
            list(d["rows"].items()),
        )
        + f"\n\nTarget: {d.get('target')}. Sampler {code(d.get('sampler'))}, {d.get('images')} images, guidance {d.get('guidance_scale')}."
    )


def r_experts_build(d: dict) -> str:
    r = d.get("recover", {})
    return table(
        [("field", lambda kv: kv[0]), ("value", lambda kv: kv[1])],
        [
            ("specs", code(d.get("specs"))),
            ("recovery steps", f"{r.get('steps', d.get('recover_steps')):,}"),
            ("batch, lr", f"{d.get('batch')}, {d.get('lr')}"),
            ("threads", d.get("threads")),
            ("seconds", sec(d.get("seconds"))),
            ("device", r.get("device")),
            ("loss first / last", f"{r.get('loss_first', 0):.4f} / {r.get('loss_last', 0):.5f}"),
        ],
    )


SECTIONS: dict[str, Section] = {
    "tome_vs_tomesd": Section(
        GROUPS[3],
        "ToMe vs tomesd",
        "`benchmarks/tome_vs_tomesd.py`",
        "fastdiff's `tome(ratio=0.5)` against the `tomesd` package on tiny-sd, order alternated per run.",
        r_tome,
    ),
    "quantize_static": Section(
        GROUPS[3],
        "int8 static quantization on the digits reference",
        "`benchmarks/quantize.py`",
        "`quantize(mode=int8-static)` (PT2E + inductor) and `compile` against fp32 eager.",
        r_quantize,
    ),
    "quantize": Section(
        GROUPS[3],
        "torchao quantization modes",
        "`benchmarks/quantize.py`",
        "`int8-dynamic` and `int8-weight`, alone and with `compile`, on the digits reference and tiny-sd.",
        r_quantize,
    ),
    "runtime": Section(
        GROUPS[3],
        "Runtime accelerators on tiny-sd",
        "`benchmarks/quantize.py --suite runtime`",
        "`compile`, `fuse` and the attention backends on tiny-sd.",
        r_quantize,
    ),
    "compress_digits": Section(
        GROUPS[3],
        "Pruning and low-rank on the digits reference",
        "`benchmarks/compress_digits.py`",
        "`prune(ratio=0.5)` and `lowrank(energy=0.9)`, without and with recovery by distillation.",
        r_compress,
    ),
    "prune_dit": Section(
        GROUPS[3],
        "DiT pruning",
        "`fastdiff bench`",
        "`prune(ratio=0.5)` on the tiny DiT (random weights, no recovery).",
        r_bench,
    ),
    "experts_digits": Section(
        GROUPS[3],
        "Timestep experts on the digits reference",
        "`benchmarks/experts_digits.py bench`",
        "A pruned model on the first part of the trajectory, the full model on the rest.",
        r_experts,
    ),
    "experts_digits_build": Section(
        GROUPS[3],
        "The pruned expert's recovery",
        "`benchmarks/experts_digits.py build`",
        "The CPU recovery of the pruned model used by the experts benchmark.",
        r_experts_build,
    ),
}
