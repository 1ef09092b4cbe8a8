"""Caching, step reuse and guidance: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, pct, per_model, r_bench, rel, sec, table
from .section import GROUPS, Section


def r_cache(d: dict) -> str:
    return table(
        [
            ("config", lambda c: c["name"]),
            ("specs", lambda c: code(c.get("specs"))),
            ("NFE", lambda c: c.get("nfe")),
            ("CPU s (median)", lambda c: sec(c.get("cpu_seconds_median"))),
            ("CPU speedup", lambda c: fx(c.get("cpu_speedup"))),
            ("wall speedup", lambda c: fx(c.get("speedup"))),
            ("PSNR vs base", lambda c: db(c.get("psnr"))),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
        ],
        d["configs"],
    )


def r_step_reuse(d: dict) -> str:
    def render(m):
        return table(
            [
                ("config", lambda c: c["name"]),
                ("specs", lambda c: code(c.get("specs"))),
                ("NFE", lambda c: c.get("denoiser_calls")),
                ("CPU speedup", lambda c: fx(c.get("cpu_speedup"))),
                ("wall speedup", lambda c: fx(c.get("speedup"))),
                ("PSNR vs none", lambda c: db(c.get("psnr"))),
                ("accuracy", lambda c: pct(c.get("accuracy"))),
                ("FD", lambda c: num(c.get("fd"))),
            ],
            m["configs"],
        )

    def describe(m):
        s = m.get("settings", {})
        g = s.get("inputs", {}).get("guidance_scale")
        return f"{m.get('pipeline')}, batch {s.get('batch')}, guidance {g:g}, {s.get('rounds')} rounds, timing: {m.get('timing')}"

    return per_model(d, render, describe)


def r_deepcache_vs_package(d: dict) -> str:
    s = d.get("summary", {})
    out = table(
        [
            ("config", lambda c: c["name"]),
            ("CPU s (median)", lambda c: sec(c.get("cpu_seconds_median"))),
            ("CPU speedup", lambda c: fx(c.get("cpu_speedup"))),
            ("wall speedup", lambda c: fx(c.get("speedup"))),
            ("PSNR vs no cache", lambda c: db(c.get("psnr"))),
        ],
        d["configs"],
    )
    return out + (
        f"\n\nfastdiff vs the package: {fx(s.get('ours_vs_package'))} (CPU), {fx(s.get('ours_vs_package_wall'))} (wall);"
        f" PSNR difference {s.get('psnr_ours_minus_package', 0):+.2f} dB; images identical: {s.get('outputs_identical_to_package')}."
    )


def r_classifier_guidance(d: dict) -> str:
    sweep = table(
        [
            ("config", lambda c: c["name"]),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("CPU s", lambda c: sec(c.get("cpu_seconds"))),
        ],
        d["sweep"],
    )
    overhead = table(
        [
            ("guided config", lambda kv: kv[0]),
            ("unguided s", lambda kv: sec(kv[1].get("unguided_seconds"))),
            ("guided s", lambda kv: sec(kv[1].get("guided_seconds"))),
            ("extra wall", lambda kv: rel(kv[1].get("extra_wall"))),
            ("extra CPU", lambda kv: rel(kv[1].get("extra_cpu"))),
        ],
        list(d["overhead"].items()),
    )
    equal = table(
        [
            ("config", lambda c: c["name"]),
            ("steps", lambda c: c.get("steps")),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("wall s", lambda c: sec(c.get("seconds_median", c.get("seconds")))),
        ],
        d["equal_compute"],
    )
    by_t = d.get("classifier_report", {}).get("test_accuracy_by_t", {})
    clf = (
        table(
            [("t", lambda kv: "accuracy")] + [(str(t), lambda _, a=a: pct(a)) for t, a in by_t.items()],
            [None],
        )
        if by_t
        else ""
    )
    return (
        (
            f"The noise-aware classifier's accuracy on the held-out test images noised to timestep t:\n\n{clf}\n\n"
            if clf
            else ""
        )
        + f"Accuracy and FD by scale and window (`uncond`: the null class):\n\n{sweep}\n\n"
        f"Cost of the guidance (paired rounds):\n\n{overhead}\n\n"
        f"Classifier vs classifier-free guidance at equal measured compute:\n\n{equal}"
    )


SECTIONS: dict[str, Section] = {
    "cache_digits": Section(
        GROUPS[1],
        "DeepCache on the digits reference",
        "`benchmarks/cache_dit.py`",
        "`deepcache` intervals, branches and schedules on the digits reference (500 images).",
        r_cache,
    ),
    "cache_tiny-dit": Section(
        GROUPS[1],
        "Block caching on tiny-dit",
        "`benchmarks/cache_dit.py`",
        "`blockcache` modes on the tiny DiT (random weights): speed and PSNR vs no cache.",
        r_cache,
    ),
    "cache_tiny-sdxl": Section(
        GROUPS[1],
        "DeepCache on tiny-sdxl",
        "`benchmarks/cache_dit.py`",
        "`deepcache` on the SDXL-shaped tiny model (random weights).",
        r_cache,
    ),
    "deepcache_vs_package": Section(
        GROUPS[1],
        "DeepCache vs the DeepCache package",
        "`benchmarks/deepcache_vs_package.py`",
        "fastdiff's `deepcache` against the `DeepCache` package on tiny-sd, same settings.",
        r_deepcache_vs_package,
    ),
    "digits_sd": Section(
        GROUPS[1],
        "SD-shaped accelerators on digits-sd",
        "`benchmarks/digits_sd.py`",
        "tome, deepcache, promptcache, cfg-interval and forecast on a trained StableDiffusionPipeline, with accuracy and FD.",
        r_bench,
    ),
    "step_reuse": Section(
        GROUPS[1],
        "Step reuse: forecast, cfg-interval, promptcache",
        "`benchmarks/step_reuse.py`",
        "Each config paired with an adjacent baseline call; tiny models (PSNR) and the digits reference (accuracy, FD).",
        r_step_reuse,
    ),
    "step_reuse_digits_combined": Section(
        GROUPS[1],
        "deepcache + cfg-interval on the digits reference",
        "`benchmarks/step_reuse.py`",
        "The combined `deepcache(interval=3)` + `cfg-interval(start=0.0,end=0.4)` re-timed alone, paired.",
        r_step_reuse,
    ),
    "classifier_guidance": Section(
        GROUPS[2],
        "Classifier guidance on the digits reference",
        "`benchmarks/classifier_guidance.py`",
        "A noise-aware classifier steering the unconditional digits model: quality by scale and window, cost, and CFG at equal compute.",
        r_classifier_guidance,
    ),
}
