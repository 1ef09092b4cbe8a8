"""Peak memory of one `fastdiff distill dmd` training step, full mode against LoRA mode, at published sizes.

Each case runs in a fresh process: the denoiser at its published layout with random weights (fastdiff.zoo.full_size:
SD 1.5's UNet, 859.5M parameters; SD 3.5 medium's MMDiT-X, 2243.2M), at a small resolution (``--side`` pixels,
default 256), batch 1, guidance 2, one fake-score update, on the CPU in fp32. The step is the command's own loss
(``fastdiff.distill.dmd_loss.dmd_loss_fn``) and an AdamW step of the generator, as ``fastdiff.train.loop.train``
takes it. Memory is the process's peak resident set (``ru_maxrss``) after the step, and after loading alone.

- **full**: the teacher, a fake score and a generator, each a whole copy, both trained by AdamW;
- **lora**: one copy (the teacher), with the generator and the fake score as two rank-``--rank`` adapters
  (``fastdiff.distill.dmd_lora``).

A case whose weights, gradients and AdamW states alone (4 bytes x parameters x (3 copies + 2 gradients + 4 AdamW
moments) in full mode) exceed this machine's memory is not run: it is recorded with that estimate. LoRA mode needs
a teacher that predicts v or flow velocity: SD 1.5's UNet is measured with a v-prediction schedule (SD 2's), the
same weights and compute.

    python -m benchmarks.onestep_memory                       # writes benchmarks/results/onestep_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MODELS = ("sd15", "sd35-medium")
MODES = ("lora", "full")
FULL_BYTES_PER_PARAMETER = 4 * (3 + 2 + 4)  # fp32: 3 copies, 2 gradients, 2 AdamW moments for each of 2 models


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine_mib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


class SyntheticBatches:
    """What ``dmd_loss_fn`` reads from ``fastdiff.train.data.Batches``: random conditioning of the real shapes."""

    def __init__(self, key: str, shape: tuple, cond: dict, size: int = 1):
        self.key, self.shape, self.size, self._cond = key, shape, size, cond

    def batch(self, g):
        import torch

        cond = {k: torch.randn((self.size, *s), generator=g) for k, s in self._cond.items()}
        return None, cond, {k: torch.zeros_like(v) for k, v in cond.items()}


def case(model: str, mode: str, side: int, rank: int) -> dict:
    import torch
    from diffusers import (
        DDPMScheduler,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        UNet2DConditionModel,
    )

    from fastdiff.distill.common import fresh_copy
    from fastdiff.distill.dmd_lora import FAKE, GENERATOR, add_adapters
    from fastdiff.distill.dmd_loss import dmd_loss_fn
    from fastdiff.distill.process import process_for
    from fastdiff.zoo.full_size_layouts import SD15_UNET, SD35_MEDIUM, SD_BETAS

    torch.manual_seed(0)
    latent = side // 8
    if model == "sd15":
        den = UNet2DConditionModel(**SD15_UNET).eval()
        scheduler = DDPMScheduler(**SD_BETAS, prediction_type="v_prediction")
        key, shape, cond = "sample", (4, latent, latent), {"encoder_hidden_states": (77, 768)}
    else:
        den = SD3Transformer2DModel(**SD35_MEDIUM).eval()
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
        key, shape = "hidden_states", (16, latent, latent)
        cond = {
            "encoder_hidden_states": (154, SD35_MEDIUM["joint_attention_dim"]),
            "pooled_projections": (SD35_MEDIUM["pooled_projection_dim"],),
        }
    parameters = sum(p.numel() for p in den.parameters())
    loaded = peak_mib()
    if mode == "lora":
        views = add_adapters(den, rank)
        teacher, fake, generator = views["teacher"], views[FAKE], views[GENERATOR]
    else:
        teacher = den.requires_grad_(False)
        fake, generator = fresh_copy(den).requires_grad_(True), fresh_copy(den).requires_grad_(True)
    trainable = sum(p.numel() for p in generator.parameters())
    fake_opt = torch.optim.AdamW(fake.parameters(), lr=1e-5)
    opt = torch.optim.AdamW(generator.parameters(), lr=1e-5)
    process = process_for(scheduler)
    batches = SyntheticBatches(key, shape, cond)
    loss_fn = dmd_loss_fn(process, key, batches, teacher, fake, fake_opt, 2.0, 20, 980, 1, "dmd", 1.2, 0.0, None)
    start = time.perf_counter()
    loss, _ = loss_fn(generator, torch.Generator().manual_seed(0), torch.device("cpu"))
    loss.backward()
    opt.step()
    return {
        "model": model,
        "mode": mode,
        "side": side,
        "rank": rank if mode == "lora" else None,
        "parameters": parameters,
        "trainable_parameters": trainable,
        "loaded_peak_mib": round(loaded),
        "step_peak_mib": round(peak_mib()),
        "step_seconds": round(time.perf_counter() - start, 1),
        "loss_finite": bool(torch.isfinite(loss)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS / "onestep_memory.json")
    parser.add_argument("--case", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(*args.case, args.side, args.rank)))
        return
    from fastdiff.eval.record import write_record
    from fastdiff.zoo.full_size_layouts import LAYOUTS

    rows, machine = [], machine_mib()
    for model in args.models:
        for mode in args.modes:
            need = LAYOUTS[model].denoiser_params * FULL_BYTES_PER_PARAMETER / 2**20
            if mode == "full" and need > 0.9 * machine:
                rows.append(
                    {
                        "model": model,
                        "mode": mode,
                        "side": args.side,
                        "not_run": True,
                        "estimated_state_mib": round(need),
                        "machine_mib": round(machine),
                        "why": "weights, gradients and AdamW states alone exceed this machine's memory",
                    }
                )
                print(f"{model} {mode}: not run, needs about {need / 1024:.1f} GiB before activations")
                continue
            command = [
                sys.executable,
                "-m",
                "benchmarks.onestep_memory",
                "--case",
                model,
                mode,
                "--side",
                str(args.side),
                "--rank",
                str(args.rank),
            ]
            done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parents[1])
            if done.returncode != 0:
                raise SystemExit(f"{model} {mode} failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            if mode == "full":
                row["estimated_state_mib"] = round(need)
            rows.append(row)
            print(json.dumps(row))
    result = {
        "device": "CPU",
        "dtype": "float32",
        "batch": 1,
        "guidance": 2.0,
        "fake_updates": 1,
        "rows": rows,
    }
    write_record(args.out, result, benchmark="onestep_memory", indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
