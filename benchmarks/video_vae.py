"""``vae-tiling`` on a long clip: the peak memory of decoding it, with and without, and the tiled frames' PSNR.

Each decode runs in a fresh process (peak resident memory is per process): the bench-size tiny video model's
autoencoder decodes seeded latents of ``--frames`` frames at ``--side`` pixels, one torch thread. The decode's peak
is the process's peak resident set after the decode minus its resident set just before it; CPU seconds are the
decode's. PSNR compares the tiled clip with the plain one over every frame.

    .venv/bin/python benchmarks/video_vae.py                        # every video family, 256 px, 65 frames
    .venv/bin/python benchmarks/video_vae.py --models tiny-ltx --side 128 --frames 17   # a quick run

Writes ``benchmarks/results/video_vae.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fastdiff.eval.record import write_record

RESULTS = Path(__file__).parent / "results"
MODELS = ("tiny-wan", "tiny-cogvideox", "tiny-ltx", "tiny-hunyuan-video")
CONFIGS = {"plain": "", "vae-tiling": "vae-tiling"}


def _decode(name: str, spec: str, side: int, frames: int, out: str, queue) -> None:
    import psutil
    import torch

    from fastdiff import FastPipeline
    from fastdiff.core.models import spatial_factor
    from fastdiff.zoo.tiny import make_pipeline

    torch.set_num_threads(1)
    fp = FastPipeline(make_pipeline(name, "bench"))
    if spec:
        fp.accelerate(spec)
    vae = fp.pipe.vae
    channels = vae.config.get("z_dim") or vae.config.latent_channels
    temporal = getattr(fp.pipe, "vae_scale_factor_temporal", None) or fp.pipe.vae_temporal_compression_ratio
    latent = side // spatial_factor(fp.pipe)
    shape = (1, channels, (frames - 1) // temporal + 1, latent, latent)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    before = psutil.Process().memory_info().rss
    start = time.process_time()
    with torch.no_grad():
        video = vae.decode(latents).sample
    seconds = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    np.save(out, video.float().clamp(-1, 1).permute(0, 2, 3, 4, 1).numpy())  # (batch, frames, height, width, rgb)
    queue.put(
        {
            "decode_peak_mb": round((peak - before) / 2**20, 1),
            "cpu_seconds": round(seconds, 2),
            "frames_out": int(video.shape[2]),
        }
    )


def measure(name: str, side: int, frames: int) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, spec in CONFIGS.items():
            queue = context.Queue()
            out = f"{tmp}/{label}.npy"
            process = context.Process(target=_decode, args=(name, spec, side, frames, out, queue))
            process.start()
            row = queue.get()
            process.join()
            rows.append({"config": label, "spec": spec, **row})
        plain, tiled = (np.load(f"{tmp}/{label}.npy") for label in CONFIGS)
    from fastdiff.eval.fidelity import psnr

    rows[1]["psnr"] = round(psnr((tiled + 1) / 2, (plain + 1) / 2), 1)
    rows[1]["memory_ratio"] = round(rows[0]["decode_peak_mb"] / max(rows[1]["decode_peak_mb"], 1e-3), 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--frames", type=int, default=65)
    parser.add_argument("--out", default=str(RESULTS / "video_vae.json"))
    args = parser.parse_args()
    out = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "device": f"CPU, {os.cpu_count()} cores",
        "side": args.side,
        "frames": args.frames,
        "threads": 1,
        "size": "bench",
        "models": {},
    }
    for name in args.models.split(","):
        out["models"][name] = measure(name, args.side, args.frames)
        write_record(Path(args.out), out, benchmark="video_vae", indent=1)
        for row in out["models"][name]:
            extra = f"  x{row['memory_ratio']} less memory, psnr {row['psnr']}" if "psnr" in row else ""
            print(
                f"{name:20s} {row['config']:12s} peak {row['decode_peak_mb']:8.1f} MB  "
                f"{row['cpu_seconds']:7.2f} s{extra}",
                flush=True,
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
