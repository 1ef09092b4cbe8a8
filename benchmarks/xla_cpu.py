"""fastdiff on torch-xla's CPU backend vs CPU eager: s/image, compile counts, and the pixel difference.

Run in ``.venv-xla`` (``make test-xla`` makes it), alone on the machine, under the shared lock::

    flock /tmp/fastdiff-heavy.lock env PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/xla_cpu.py
    # -> benchmarks/results/xla_cpu.json

Models: tiny-sd at test size (2 prompts, guidance 7.5) and the digits reference (10 labels, guidance 2), dpm++2m
20 steps, alone and with deepcache(interval=3); the baseline also in bfloat16 (XLA and eager). Each setting goes
through ``tpu_infer`` (the ``fastdiff tpu-infer`` driver): one warm-up call, then ``--runs`` timed calls of the
same shape. CPU eager runs the same calls with 1 and 2 torch threads (XLA's CPU backend uses its own thread
pool over all cores). Quality: PSNR and the largest pixel difference against CPU eager fp32 of the same specs.
XLA's CPU backend is a test stand-in for a TPU, not a way to speed up CPU inference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from fastdiff.cli.tpu_infer import tpu_infer
from fastdiff.eval.fidelity import psnr
from fastdiff.eval.record import write_record
from fastdiff.zoo import build
from fastdiff.zoo.shipped import ensure_digits

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLER = "scheduler(name=dpm++2m,steps=20)"
CONFIGS = {"dpm++2m 20": SAMPLER, "dpm++2m 20 + deepcache(3)": f"{SAMPLER};deepcache(interval=3)"}
MODELS = {"tiny-sd": {"batch": 2, "guidance": 7.5}, "digits": {"batch": 10, "guidance": 2.0}}


def fidelity(images: np.ndarray, reference: np.ndarray) -> dict:
    return {
        "psnr_vs_eager": round(psnr(images, reference), 2),
        "max_abs_diff_vs_eager": float(np.abs(images.astype(np.float64) - reference).max()),
    }


def measure(model, specs: str, call: dict, runs: int) -> dict:
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        eager = tpu_infer(model, specs, device="cpu", runs=runs, **call)
        out[f"eager_{threads}t"] = {"s_per_image": eager["s_per_image"], "seconds": eager["seconds"]}
    torch.set_num_threads(1)  # XLA runs its graphs on its own pool; torch's threads only do host work
    xla = tpu_infer(model, specs, device="xla", runs=runs, **call)
    out["xla"] = {k: xla[k] for k in ("s_per_image", "seconds", "warmup", "timed")}
    out["xla"].update(fidelity(xla["images"], eager["images"]))
    if "deepcache" not in specs:  # bfloat16: against fp32 eager (what bf16 costs) and bf16 eager (what XLA adds)
        eager_bf16 = tpu_infer(model, specs, device="cpu", bf16=True, runs=1, **call)
        xla = tpu_infer(model, specs, device="xla", bf16=True, runs=runs, **call)
        out["xla_bf16"] = {k: xla[k] for k in ("s_per_image", "seconds", "warmup", "timed")}
        out["xla_bf16"].update(fidelity(xla["images"], eager["images"]))
        out["xla_bf16"]["psnr_vs_eager_bf16"] = round(psnr(xla["images"], eager_bf16["images"]), 2)
        out["eager_bf16_1t"] = {
            "s_per_image": eager_bf16["s_per_image"],
            **fidelity(eager_bf16["images"], eager["images"]),
        }
    out["xla_vs_eager_1t"] = out["eager_1t"]["s_per_image"] / out["xla"]["s_per_image"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    parser.add_argument("--out", type=Path, default=RESULTS / "xla_cpu.json")
    args = parser.parse_args()
    import torch_xla

    paths = {
        "tiny-sd": build("tiny-sd", args.cache / "tiny-sd-test", size="test"),
        "digits": ensure_digits(args.cache / "digits"),
    }
    result = {
        "setup": {
            "torch": torch.__version__,
            "torch_xla": torch_xla.__version__,
            "cpus": os.cpu_count(),
            "PJRT_DEVICE": os.environ.get("PJRT_DEVICE"),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "machine": platform.processor() or platform.machine(),
            "runs": args.runs,
        },
    }
    for name, call in MODELS.items():
        for label, specs in CONFIGS.items():
            entry = measure(paths[name], specs, call, args.runs)
            result[f"{name} / {label}"] = {"specs": specs, **call, **entry}
            print(name, label, json.dumps({k: v for k, v in entry.items() if k != "seconds"}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_record(args.out, result, benchmark="xla_cpu", indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
