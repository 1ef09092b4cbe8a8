"""Training of the digits reference UNet: the model, its DDPM schedule and a fixed-step, seeded trainer.

``train_unet`` runs exactly ``steps`` optimizer steps; the weights depend only on the seed, the step count
and the data, never on how fast the machine happens to be (see ``fastdiff.zoo.reference`` for the build).

Example::

    from pathlib import Path
    from fastdiff.zoo.reference import digits_split
    from fastdiff.zoo.reference_train import train_unet

    split = digits_split(16)
    unet, summary = train_unet(Path("/tmp/d"), split["x_train"], split["y_train"], steps=5, resolution=16,
                               seed=0, resume=False)
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.training_utils import EMAModel, compute_snr
from tqdm.auto import tqdm

NUM_CLASSES = 10
NULL_CLASS = NUM_CLASSES  # extra class embedding used as "no label" for classifier-free guidance


def reference_unet(resolution: int = 16) -> UNet2DModel:
    """Class-conditional UNet (32/64/64 channels, self-attention at the two lower resolutions, 11 classes)."""
    return UNet2DModel(
        sample_size=resolution,
        in_channels=1,
        out_channels=1,
        block_out_channels=(32, 64, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=32,
        norm_num_groups=8,
        num_class_embeds=NUM_CLASSES + 1,
    )


def training_scheduler() -> DDPMScheduler:
    """DDPM, 1000 steps, linear betas, epsilon prediction, no sample clipping (clipping breaks CFG)."""
    return DDPMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", prediction_type="epsilon", clip_sample=False
    )


def _atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _learning_rate(base_lr: float, step: int, progress: float, warmup_steps: int = 100) -> float:
    """Linear warmup, then cosine decay to 10% over training ``progress`` (step / steps) in [0, 1]."""
    warm = min(1.0, (step + 1) / warmup_steps)
    return base_lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train_unet(
    out_dir: Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    steps: int,
    resolution: int,
    seed: int,
    resume: bool,
    batch_size: int = 64,
    lr: float = 1e-3,
    label_dropout: float = 0.1,
    snr_gamma: float | None = 5.0,
    checkpoint_every_s: float = 60.0,
    log_every: int = 20,
    rate_probe_steps: int = 20,
) -> tuple[UNet2DModel, dict]:
    """DDPM training for exactly ``steps`` optimizer steps (accelerate, EMA, Min-SNR loss, JSONL log, resumable).

    The result depends only on ``seed``, ``steps`` and the data (not on time or load): batches come from a
    per-epoch permutation seeded by (seed, epoch), noise, timesteps and label dropout from a seeded generator
    whose state is checkpointed, so a resumed run continues exactly where it stopped. After
    ``rate_probe_steps`` steps it prints the measured rate and the estimated time left. Returns the EMA UNet
    (eval mode) and a summary (steps, train_seconds, steps_per_s, final loss).

    Example::

        split = digits_split(16)
        unet, summary = train_unet(Path("/tmp/d"), split["x_train"], split["y_train"], steps=5,
                                   resolution=16, seed=0, resume=False)
    """
    if steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps}")
    ckpt_path, log_path = out_dir / "checkpoint.pt", out_dir / "train_log.jsonl"
    torch.manual_seed(seed)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    device = accelerator.device
    unet = reference_unet(resolution)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=0.0)
    images = torch.as_tensor(x_train) * 2.0 - 1.0  # the model works in [-1, 1]
    labels_all = torch.as_tensor(y_train).long()
    batch_size = min(batch_size, len(images))
    batches_per_epoch = len(images) // batch_size  # drop_last
    unet, optimizer = accelerator.prepare(unet, optimizer)
    ema = EMAModel(accelerator.unwrap_model(unet).parameters(), decay=0.999)
    noise_scheduler = training_scheduler()
    generator = torch.Generator().manual_seed(seed)  # noise, timesteps, label dropout (on CPU: device-independent)
    step, elapsed = 0, 0.0
    if resume and ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if state["resolution"] != resolution:
            raise ValueError(f"checkpoint has resolution {state['resolution']}, asked for {resolution}")
        if "generator" not in state:
            raise ValueError(f"{ckpt_path} is from the old time-budgeted trainer; start afresh without --resume")
        accelerator.unwrap_model(unet).load_state_dict(state["unet"])
        optimizer.load_state_dict(state["optimizer"])
        ema.load_state_dict(state["ema"])
        step, elapsed = state["step"], state["elapsed_s"]
        generator.set_state(state["generator"])
    elif not resume:
        log_path.unlink(missing_ok=True)
        ckpt_path.unlink(missing_ok=True)

    start_step, run_start, last_ckpt = step, time.perf_counter(), time.perf_counter()

    def elapsed_now() -> float:
        return elapsed + time.perf_counter() - run_start

    def save_checkpoint() -> None:
        state = {
            "unet": accelerator.unwrap_model(unet).state_dict(),
            "optimizer": optimizer.state_dict(),
            "ema": ema.state_dict(),
            "step": step,
            "elapsed_s": elapsed_now(),
            "generator": generator.get_state(),
            "resolution": resolution,
            "seed": seed,
            "steps": steps,
        }
        _atomic_torch_save(state, ckpt_path)

    recent_losses: list[float] = []

    def write_log_row() -> None:
        steps_per_s = (step - start_step) / max(time.perf_counter() - run_start, 1e-9)
        row = {
            "step": step,
            "loss": round(float(np.mean(recent_losses)), 5),
            "lr": optimizer.param_groups[0]["lr"],
            "elapsed_s": round(elapsed_now(), 2),
            "steps_per_s": round(steps_per_s, 3),
        }
        log.write(json.dumps(row) + "\n")
        log.flush()
        bar.set_postfix(loss=f"{row['loss']:.4f}")

    def batch_indices(at_step: int) -> torch.Tensor:
        epoch, position = divmod(at_step, batches_per_epoch)
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        return order[position * batch_size : (position + 1) * batch_size]

    unet.train()
    if step < steps:
        print(f"training the digits UNet: steps {step} -> {steps} (batch {batch_size}, seed {seed})", flush=True)
    bar = tqdm(total=steps, initial=min(step, steps), unit="step", desc="digits ddpm", dynamic_ncols=True)
    probe_start, probe_from = None, None
    with log_path.open("a") as log:
        while step < steps:
            if step == start_step + 2:  # skip the first (warm-up) steps when measuring the rate
                probe_start, probe_from = time.perf_counter(), step
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(lr, step, step / steps)
            index = batch_indices(step)
            x0, labels = images[index], labels_all[index]
            drop = torch.rand(labels.shape, generator=generator) < label_dropout
            labels = torch.where(drop, torch.full_like(labels, NULL_CLASS), labels)
            noise = torch.randn(x0.shape, generator=generator)
            t = torch.randint(0, noise_scheduler.config.num_train_timesteps, (x0.shape[0],), generator=generator)
            x0, labels, noise, t = (v.to(device) for v in (x0, labels, noise, t))
            noisy = noise_scheduler.add_noise(x0, noise, t)
            per_sample = F.mse_loss(unet(noisy, t, class_labels=labels).sample, noise, reduction="none")
            per_sample = per_sample.mean(dim=(1, 2, 3))
            if snr_gamma:  # Min-SNR weighting (Hang et al. 2023): faster convergence
                snr = compute_snr(noise_scheduler, t)
                per_sample = per_sample * snr.clamp(max=snr_gamma) / snr
            loss = per_sample.mean()
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(unet.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            ema.step(accelerator.unwrap_model(unet).parameters())
            step += 1
            bar.update(1)
            recent_losses = (recent_losses + [loss.item()])[-log_every:]
            if probe_start is not None and step == probe_from + rate_probe_steps and step < steps:
                rate = rate_probe_steps / max(time.perf_counter() - probe_start, 1e-9)
                bar.write(
                    f"measured {rate:.2f} steps/s over {rate_probe_steps} steps: "
                    f"about {_duration((steps - step) / rate)} left for {steps - step} steps"
                )
            if step % log_every == 0:
                write_log_row()
            if time.perf_counter() - last_ckpt >= checkpoint_every_s:
                save_checkpoint()
                last_ckpt = time.perf_counter()
        if recent_losses and step % log_every:
            write_log_row()
    bar.close()
    save_checkpoint()
    run_seconds = time.perf_counter() - run_start
    ema_unet = reference_unet(resolution)
    ema.copy_to(ema_unet.parameters())
    summary = {
        "steps": step,
        "seed": seed,
        "train_seconds": round(elapsed + run_seconds, 1),
        "batch_size": batch_size,
        "lr": lr,
        "snr_gamma": snr_gamma,
        "label_dropout": label_dropout,
        "session_steps_per_s": round((step - start_step) / max(run_seconds, 1e-9), 3),
        "final_loss": float(np.mean(recent_losses)) if recent_losses else None,
    }
    return ema_unet.eval(), summary


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


__all__ = ["NUM_CLASSES", "NULL_CLASS", "reference_unet", "training_scheduler", "train_unet"]
