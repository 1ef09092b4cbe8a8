"""Video models: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, over_floor, pct, sec, selection_tables, table
from .renderers_flow import CACHING_COLUMNS, r_flow_families, r_teacache_fit, selection_note
from .section import GROUPS, Section


def r_video_vae(d: dict) -> str:
    rows = [{"model": name, **row} for name, rows in d["models"].items() for row in rows]
    return table(
        [
            ("model", lambda r: r["model"]),
            ("config", lambda r: code(r.get("spec")) or "plain"),
            ("decode peak MB", lambda r: num(r.get("decode_peak_mb"), 1)),
            ("memory saved", lambda r: fx(r.get("memory_ratio"))),
            ("decode CPU s", lambda r: sec(r.get("cpu_seconds"))),
            ("PSNR vs plain", lambda r: db(r.get("psnr"))),
        ],
        rows,
    ) + (
        f"\n\n{d.get('frames')} frames at {d.get('side')} px decoded from seeded latents by each bench-size "
        "video VAE, one process per decode, one thread; the peak is the process's peak resident memory during "
        "the decode above what it held before it."
    )


def r_video_families(d: dict) -> str:
    return r_flow_families(d).replace("CPU seconds of one call", "CPU seconds of one 9-frame clip")


_VIDEO_QUALITY = [
    ("digit accuracy", lambda r: pct(r.get("accuracy"))),
    ("direction accuracy", lambda r: pct(r.get("direction_accuracy"))),
    ("FD", lambda r: num(r.get("fd"))),
    ("FD floor", lambda r: num(r.get("fd_floor"))),
    ("temporal change vs real", lambda r: num(r.get("temporal_ratio"), 3)),
]


def r_moving_digits_defaults(d: dict) -> str:
    t = d.get("target", {})
    return selection_tables(d, _VIDEO_QUALITY[:3]) + (
        f"\n\n{d.get('clips')} clips per seeded call, UniPC {d.get('steps')} steps. Target: digit and direction "
        f"accuracy >= {pct(t.get('accuracy_min'), 0)} and FD <= {t.get('fd_max_over_floor')}x the like-for-like floor; "
        '"met" when the whole FD / floor interval is within it, "undecided" when it straddles it.'
    )


def r_moving_digits_build(d: dict) -> str:
    t, v = d.get("training", {}), d.get("vae", {})
    rows = table(
        [("guidance", lambda r: r.get("guidance")), ("steps", lambda r: r.get("steps")),
         ("clips", lambda r: r.get("clips"))] + _VIDEO_QUALITY + [("s / call", lambda r: sec(r.get("seconds")))],
        d["rows"],
    )  # fmt: skip
    real = d.get("real_clips", {})
    target = d.get("target", {})
    return rows + (
        f"\n\nTraining: VAE {v.get('steps')} steps ({v.get('seconds', 0) / 60:.0f} min; reconstructions of test clips:"
        f" PSNR {num(v.get('psnr_test'), 1)} dB, digit accuracy {pct(v.get('accuracy_test'))}, FD"
        f" {num(v.get('fd_test'))}"
        + (f" where those real clips score {num(v['fd_test_real'])}" if "fd_test_real" in v else "")
        + f": what the autoencoder alone allows), transformer"
        f" {t.get('steps')} steps ({t.get('seconds', 0) / 60:.0f} min), loss {t.get('loss_first', 0):.2f} ->"
        f" {t.get('loss_last', 0):.2f}. Real test clips score {pct(real.get('accuracy'))} digit and"
        f" {pct(real.get('direction_accuracy'))} direction accuracy (the metrics' ceiling). Target: digit and"
        f" direction accuracy >= 90% and FD <= 3x the floor; met: {'yes' if target.get('met') else 'no'}."
        + (f" {d['note']}" if d.get("note") else "")
    )


def r_video_caching(d: dict) -> str:
    floor = [("FD / floor", over_floor)] if any("fd_ratio" in r for r in d["rows"]) else []
    return table(
        CACHING_COLUMNS + _VIDEO_QUALITY + floor + [("PSNR vs base", lambda r: db(r.get("psnr")))],
        d["rows"],
    ) + (
        f"\n\n{d.get('images')} clips, {d.get('steps')} steps, guidance {d.get('guidance')}, {d.get('threads')} thread(s);"
        " `fd-*` rows are fastdiff, `hf-*` rows diffusers' own caches; `computed steps`: the last block's attention calls"
        " against the baseline's."
        + (f" Configs split over {d['split']}." if d.get("split") else "")
        + (f" {d['note']}" if d.get("note") else "")
        + selection_note(d)
    )


SECTIONS: dict[str, Section] = {
    "moving_digits_defaults": Section(
        GROUPS[7],
        "moving-digits: the default guidance, chosen on one seed and reported on others",
        "`python -m fastdiff.zoo.reference_video select DIR --json OUT.json`",
        "The guidance with the lowest FD among those meeting the accuracy targets on the selection seed, and its"
        " figures (beside WanPipeline's own 5) on the report seeds, against like-for-like floors.",
        r_moving_digits_defaults,
    ),
    "moving_digits_build": Section(
        GROUPS[7],
        "The moving-digits build",
        "`python -m fastdiff.zoo.reference_video build / eval`",
        "The Wan-shaped video reference: training, and its digit and direction accuracy, FD and temporal change.",
        r_moving_digits_build,
    ),
    "moving_digits_teacache_fit": Section(
        GROUPS[7],
        "TeaCache fit on moving-digits",
        "`fastdiff fit-teacache MODEL --steps 50 --calls 4 --batch 8 --guidance 5`",
        "The fitted output-change polynomial that video_caching.sh's TeaCache rows use.",
        r_teacache_fit,
    ),
    "video_caching": Section(
        GROUPS[7],
        "Caching on moving-digits vs diffusers' caches",
        "`benchmarks/video_caching.sh`",
        "fastdiff's TeaCache and forecast against diffusers' TaylorSeer and MagCache on the trained video"
        " reference: each family's setting chosen on seed 0, reported on seed 1.",
        r_video_caching,
    ),
    "video_caching_selection": Section(
        GROUPS[7],
        "Caching on moving-digits: the selection run (seed 0)",
        "`benchmarks/caching_select.py --preset moving-digits`",
        "Every candidate setting once on selection seed 0; each family's pick is reported on seed 1 above.",
        r_video_caching,
    ),
    "video_teacache_magcache": Section(
        GROUPS[7],
        "TeaCache against MagCache on moving-digits, alone in one process",
        "`benchmarks/flow_caching.py --steps 50`",
        "fastdiff's fitted TeaCache at thresholds around MagCache's computed share, and at threshold 0 (its"
        " decision's own cost), in one process with nothing else running.",
        r_video_caching,
    ),
    "video_families": Section(
        GROUPS[7],
        "Accelerators on the tiny video families",
        "`benchmarks/flow_families.py --families video`",
        "Wan, CogVideoX, LTX-Video and HunyuanVideo bench-size random-weight builds: every accelerator's speed "
        "and PSNR against the plain clip, and what is refused.",
        r_video_families,
    ),
    "video_vae": Section(
        GROUPS[7],
        "Decoding long clips in pieces",
        "`benchmarks/video_vae.py`",
        "vae-tiling: the peak memory of decoding a long clip, with and without, and the tiled frames' PSNR.",
        r_video_vae,
    ),
}
