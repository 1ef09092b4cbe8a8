"""Several processes and devices (CFG parallel, AsyncDiff stages, stage pipelining, XLA): renderers and sections."""

from __future__ import annotations

from .format import async_table, code, db, fx, guidance_images, med, num, pct, per_model, sec, table
from .section import GROUPS, Section


def r_async(d: dict) -> str:
    models = {k: v for k, v in d.items() if isinstance(v, dict)}
    return per_model(models, async_table, guidance_images)


def r_overlap_ab(d: dict) -> str:
    rows = [("overlapped exchange", d.get("overlapped")), ("blocking exchange", d.get("blocking"))]
    out = table(
        [("exchange", lambda r: r[0]), ("s / call", lambda r: " / ".join(f"{s:.1f}" for s in r[1] or []))],
        rows,
    )
    return (
        out
        + f"\n\nSpecs {code(d.get('specs'))}, {d.get('images')} images; images identical: {d.get('identical')}."
    )


def r_profile(d: dict) -> str:
    rows = []
    for i, call in enumerate(d["calls"], 1):
        r0, r1 = call[0], call[1]
        rows.append((i, r0, r1))
    out = table(
        [
            ("call", lambda r: r[0]),
            ("call s", lambda r: sec(r[1].get("call"))),
            ("own layers rank 0 / 1 (s)", lambda r: f"{r[1]['own_layers']:.1f} / {r[2]['own_layers']:.1f}"),
            (
                "waiting for the prediction rank 0 / 1",
                lambda r: f"{r[1]['share_prediction']:.1f} / {r[2]['share_prediction']:.1f}",
            ),
            ("exchange rank 0 / 1", lambda r: f"{r[1]['exchange']:.1f} / {r[2]['exchange']:.1f}"),
            ("extrapolate rank 1", lambda r: sec(r[2].get("extrapolate"))),
            ("layers per stage", lambda r: " / ".join(map(str, r[1].get("layers_per_stage", [])))),
            ("settled", lambda r: r[1].get("settled")),
        ],
        rows,
    )
    return out + f"\n\nSpecs {code(d.get('specs'))}, {d.get('images')} images; seconds per call, per rank."


def r_parallel_cfg(d: dict) -> str:
    return table(
        [
            ("model", lambda kv: kv[0]),
            ("guidance", lambda kv: kv[1].get("call", {}).get("guidance_scale")),
            ("images", lambda kv: kv[1].get("images")),
            ("1 process, s (median)", lambda kv: sec(med(kv[1].get("single_seconds")))),
            ("2 processes, s (median)", lambda kv: sec(med(kv[1].get("parallel_seconds")))),
            ("speedup", lambda kv: fx(kv[1].get("speedup"))),
            (
                "max difference",
                lambda kv: (
                    f"{kv[1]['max_abs_difference']:.1e}"
                    if kv[1].get("max_abs_difference")
                    else "0 (identical)"
                ),
            ),
        ],
        [(k, v) for k, v in d.items() if isinstance(v, dict)],
    )


def r_parallel_sequence(d: dict) -> str:
    return table(
        [
            ("clip", lambda r: f"{r['frames']} frames, {r['side']} px"),
            ("tokens", lambda r: r["tokens"]),
            ("timed", lambda r: "denoising loop" if r["output_type"] == "latent" else "whole call"),
            ("1 process, s (median)", lambda r: sec(med(r.get("single_seconds")))),
            ("2 processes, s (median)", lambda r: sec(med(r.get("parallel_seconds")))),
            ("speedup", lambda r: fx(r.get("speedup"))),
            (
                "max difference",
                lambda r: (
                    f"{r['max_abs_difference']:.1e}" if r.get("max_abs_difference") else "0 (identical)"
                ),
            ),
        ],
        d["rows"],
    ) + (
        f"\n\nModel: {d.get('model')}; `{d.get('spec')}`; {d.get('steps')} steps, "
        f"{'guidance off' if d.get('guidance', 1.0) <= 1.0 else 'guidance ' + str(d['guidance'])}"
        f"{'; ' + str(d['batch']) + ' clips per call' if d.get('batch', 1) > 1 else ''}; "
        f"{d.get('runs')} alternating runs. The whole call includes the VAE decode, which every rank runs whole."
    )


def r_stage(d: dict) -> str:
    rows = []
    for name, s in d["settings"].items():
        split = s["split"]["seconds"]
        for key in [k for k in s if k.startswith("pipelined")]:
            p = s[key]
            rows.append((name, split, s["split"], s["sequential"], key, p))
    return table(
        [
            ("setting", lambda r: r[0]),
            (
                "text / denoiser / VAE s per request",
                lambda r: f"{r[1]['text']:.3f} / {r[1]['denoise']:.2f} / {r[1]['decode']:.3f}",
            ),
            ("denoiser share", lambda r: pct(r[2]["share"]["denoise"])),
            ("bound (2 processes)", lambda r: fx(r[2]["amdahl_bound_2_processes"])),
            ("sequential images/s", lambda r: num(r[3]["images_per_s"], 3)),
            (
                "layout",
                lambda r: (
                    r[4]
                    .replace("pipelined_3_2_denoisers", "3 processes, 2 denoisers")
                    .replace("pipelined_", "")
                    + ("" if "denoisers" in r[4] else " processes")
                ),
            ),
            ("images/s", lambda r: num(r[5]["images_per_s"], 3)),
            ("speedup", lambda r: fx(r[5]["speedup"])),
            ("max difference", lambda r: r[5].get("max_abs_difference")),
        ],
        rows,
    )


def r_xla(d: dict) -> str:
    setup = d.get("setup", {})
    rows = [(k, v) for k, v in d.items() if k != "setup" and isinstance(v, dict)]

    def graphs(v, key):
        x = v.get(key)
        return (
            None
            if not x
            else f"{x['warmup']['compiles']} ({x['warmup']['compile_s']:.1f} s) / {x['timed']['compiles']}"
        )

    return (
        table(
            [
                ("model / config", lambda kv: kv[0]),
                ("eager 1 thread, s/image", lambda kv: num(kv[1]["eager_1t"]["s_per_image"], 3)),
                ("eager 2 threads", lambda kv: num(kv[1]["eager_2t"]["s_per_image"], 3)),
                ("XLA CPU", lambda kv: num(kv[1]["xla"]["s_per_image"], 3)),
                ("XLA vs eager (1 thread)", lambda kv: fx(kv[1].get("xla_vs_eager_1t"))),
                ("compiles warm-up (time) / timed", lambda kv: graphs(kv[1], "xla")),
                (
                    "vs CPU eager fp32",
                    lambda kv: (
                        f"{kv[1]['xla']['psnr_vs_eager']:.1f} dB, max {kv[1]['xla']['max_abs_diff_vs_eager']:.1e}"
                    ),
                ),
                (
                    "XLA bf16 s/image (vs eager bf16)",
                    lambda kv: (
                        f"{kv[1]['xla_bf16']['s_per_image']:.3f} ({kv[1]['xla_bf16']['psnr_vs_eager_bf16']:.1f} dB)"
                        if "xla_bf16" in kv[1]
                        else None
                    ),
                ),
            ],
            rows,
        )
        + f"\n\ntorch {setup.get('torch')}, torch-xla {setup.get('torch_xla')}, PJRT_DEVICE={setup.get('PJRT_DEVICE')}, {setup.get('cpus')} CPUs, {setup.get('runs')} timed calls."
    )


def r_parallel_split_ab(d: dict) -> str:
    arms = [{"arm": name, **row} for name, row in d["arms"].items()]
    return (
        table(
            [
                ("arm", lambda r: r["arm"]),
                ("cfg speedup", lambda r: fx(r["cfg_speedup"])),
                (
                    "cfg 1 process / 2, median s",
                    lambda r: f"{r['cfg_single_seconds_median']} / {r['cfg_parallel_seconds_median']}",
                ),
                ("cfg max abs diff", lambda r: num(r["cfg_max_abs_difference"], 3)),
                ("async speedup", lambda r: fx(r["async_speedup"])),
                ("async PSNR vs 1 process", lambda r: db(r["async_psnr_vs_single"])),
                ("async accuracy / FD", lambda r: f"{pct(r['async_accuracy'])} / {num(r['async_fd'])}"),
                ("1 process accuracy / FD", lambda r: f"{pct(r['single_accuracy'])} / {num(r['single_fd'])}"),
            ],
            arms,
        )
        + f"\n\n{d['note']}. digits, guidance 2; cfg {arms[0]['cfg_images']} images, async {arms[0]['async_images']}."
    )


SECTIONS: dict[str, Section] = {
    "parallel_split_ab": Section(
        GROUPS[8],
        "parallel split by mode: before and after",
        "`benchmarks/parallel_cfg.py`, `benchmarks/parallel_async.py` on two trees",
        "The same benchmarks on the tree before and after parallel became one config class per mode.",
        r_parallel_split_ab,
    ),
    "parallel_cfg": Section(
        GROUPS[8],
        "parallel(mode=cfg)",
        "`benchmarks/parallel_cfg.py`",
        "Two processes x 1 thread against one process x 1 thread.",
        r_parallel_cfg,
    ),
    "parallel_cfg_moving_digits": Section(
        GROUPS[8],
        "parallel(mode=cfg) on moving-digits",
        "`benchmarks/parallel_cfg.py --models moving-digits --video-model DIR`",
        "Wan calls its transformer once per guidance branch: each rank runs one branch's call from the second step.",
        r_parallel_cfg,
    ),
    "parallel_sequence": Section(
        GROUPS[8],
        "parallel(mode=ulysses)",
        "`benchmarks/parallel_sequence.py`",
        "Sequence parallelism on a video transformer: two processes x 1 thread against one process x 1 thread.",
        r_parallel_sequence,
    ),
    "parallel_sequence_moving_digits": Section(
        GROUPS[8],
        "parallel(mode=ulysses) on moving-digits",
        "`benchmarks/parallel_sequence.py --model MODEL`",
        "Sequence parallelism on the trained video reference at its own clip size.",
        r_parallel_sequence,
    ),
    "parallel_async_digits_overlap_seeds": Section(
        GROUPS[8],
        "parallel(mode=async), digits, final code, separate launches",
        "`benchmarks/parallel_async.py`",
        "Balanced stages, shared boundary rows and the overlapped exchange; one process and async side by side, FD pooled over 3 batches.",
        r_async,
    ),
    "parallel_async_digits_overlap": Section(
        GROUPS[8],
        "parallel(mode=async), digits, final code, interleaved",
        "`benchmarks/parallel_async.py --interleave`",
        "Both arms in one launch, alternating, one batch of 500.",
        r_async,
    ),
    "parallel_async_digits_shared_rows_seeds": Section(
        GROUPS[8],
        "parallel(mode=async), digits, blocking exchange, separate launches",
        "`benchmarks/parallel_async.py`",
        "As above with the blocking exchange.",
        r_async,
    ),
    "parallel_async_digits_shared_rows": Section(
        GROUPS[8],
        "parallel(mode=async), digits, blocking exchange, interleaved",
        "`benchmarks/parallel_async.py --interleave`",
        "As above with the blocking exchange, interleaved.",
        r_async,
    ),
    "parallel_async_overlap_ab": Section(
        GROUPS[8],
        "Overlapped vs blocking exchange",
        "`benchmarks/parallel_async_overlap_ab.py`",
        "The two exchanges alternated in one launch once the cut had settled.",
        r_overlap_ab,
    ),
    "parallel_async_profile": Section(
        GROUPS[8],
        "Where an async call's time goes",
        "`benchmarks/parallel_async_profile.py`",
        "Per-rank time of own layers, waiting, exchange and extrapolation over five digits calls.",
        r_profile,
    ),
    "parallel_async_interleaved": Section(
        GROUPS[8],
        "parallel(mode=async), tiny-sd, interleaved",
        "`benchmarks/parallel_async.py --interleave`",
        "tiny-sd with workers bound to cores, both arms in one launch.",
        r_async,
    ),
    "parallel_async_pinned": Section(
        GROUPS[8],
        "parallel(mode=async), tiny-sd, separate launches",
        "`benchmarks/parallel_async.py`",
        "tiny-sd with workers bound to cores.",
        r_async,
    ),
    "parallel_async_digits_pinned": Section(
        GROUPS[8],
        "parallel(mode=async), digits, workers bound to cores",
        "`benchmarks/parallel_async.py`",
        "Digits with `extrapolate=1`, workers bound to cores, before the balancing.",
        r_async,
    ),
    "parallel_async_digits_interleaved": Section(
        GROUPS[8],
        "parallel(mode=async), digits, interleaved, before balancing",
        "`benchmarks/parallel_async.py --interleave`",
        "Digits with `extrapolate=1`, interleaved, before the balancing.",
        r_async,
    ),
    "parallel_async_retain": Section(
        GROUPS[8],
        "parallel(mode=async) with freed memory retained",
        "`benchmarks/parallel_async.py --allocator`",
        "Workers keep freed memory; one process with glibc's defaults for comparison.",
        r_async,
    ),
    "parallel_async_retain_tiny": Section(
        GROUPS[8],
        "parallel(mode=async), tiny-sd, freed memory retained",
        "`benchmarks/parallel_async.py`",
        "tiny-sd, warm-up 1 and 2, `extrapolate=1`.",
        r_async,
    ),
    "parallel_async_extrapolate": Section(
        GROUPS[8],
        "parallel(mode=async): extrapolate=1",
        "`benchmarks/parallel_async.py --extrapolate both`",
        "Plain async against `extrapolate=1` (stale activations carried on to the current timestep).",
        r_async,
    ),
    "parallel_async_seeds": Section(
        GROUPS[8],
        "parallel(mode=async), digits, warm-up 2-4, three seeds",
        "`benchmarks/parallel_async.py`",
        "Plain async on digits with longer warm-ups, FD pooled over three batches.",
        r_async,
    ),
    "parallel_async": Section(
        GROUPS[8],
        "parallel(mode=async), first measurement",
        "`benchmarks/parallel_async.py`",
        "Plain async on tiny-sd and digits, and `cooldown=2` on digits.",
        r_async,
    ),
    "parallel_async_full_exchange": Section(
        GROUPS[8],
        "parallel(mode=async), every output exchanged",
        "`benchmarks/parallel_async.py`",
        "Plain async before the exchange was made selective.",
        r_async,
    ),
    "stage_pipeline": Section(
        GROUPS[8],
        "Stage pipelining (StagePipeline)",
        "`benchmarks/stage_pipeline.py`",
        "Text encoder, denoiser and VAE decoder as stages on processes, 32 requests, against the same requests one after another.",
        r_stage,
    ),
    "xla_cpu": Section(
        GROUPS[8],
        "torch-xla on XLA's CPU backend",
        "`benchmarks/xla_cpu.py`",
        "Eager CPU against XLA's CPU backend: time, compiles, and difference to eager.",
        r_xla,
    ),
}
