"""Video models: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, sec, table
from .renderers_flow import r_flow_families
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


SECTIONS: dict[str, Section] = {
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
