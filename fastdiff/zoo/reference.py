"""The digits reference model: a small class-conditional DDPM trained here, fastdiff's quality yardstick.

Random-weight models cannot tell a good accelerator from a bad one; this one generates real digits, so
accuracy (by a separately trained classifier) and FD (on its features) measure what an accelerator costs.

Layout of a build directory::

    model_index.json, unet/, scheduler/     the ClassConditionalPipeline (EMA weights, DDPM, clip_sample=False)
    eval/classifier.pt, eval/split.npz      evaluation classifier and the fixed train/test split
    eval/report.json                        classifier test accuracy, fd_floor, training summary
    train_log.jsonl, checkpoint.pt          loss log and the resumable training state

Example::

    from fastdiff.zoo.reference import build_reference
    path = build_reference("/tmp/digits", minutes=0.2)
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
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel
from diffusers.training_utils import EMAModel, compute_snr
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from fastdiff.eval.classifier import classifier_accuracy, load_classifier, save_classifier, train_classifier
from fastdiff.eval.quality import accuracy, fd, fd_floor
from fastdiff.zoo import register_model
from fastdiff.zoo.pipelines import ClassConditionalPipeline

RESOLUTIONS = (16, 32)
NUM_CLASSES = 10
NULL_CLASS = NUM_CLASSES  # extra class embedding used as "no label" for classifier-free guidance
TEST_SIZE = 360
SIZES = {
    "test": dict(minutes=1.0, classifier_epochs=8, eval_per_class=0),
    # 3000 steps reach FD ~ fd_floor; on an idle 2-core machine that takes ~12-15 min, under load the cap stops it
    "bench": dict(minutes=12.0, max_steps=3000, classifier_epochs=30, eval_per_class=50),
}


def digits_split(resolution: int = 16, seed: int = 0, test_size: int = TEST_SIZE) -> dict[str, np.ndarray]:
    """sklearn digits upsampled (bicubic) to ``resolution``, in [0, 1], with a stratified train/test split.

    Returns ``x_train``/``x_test`` (N,1,H,W) float32, ``y_train``/``y_test`` and the ``*_idx`` into load_digits.

    Example::

        split = digits_split(16)
        split["x_train"].shape  # (1437, 1, 16, 16)
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution {resolution} not supported; allowed: {RESOLUTIONS}")
    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    images = F.interpolate(images, size=(resolution, resolution), mode="bicubic", align_corners=False)
    images = images.clamp(0.0, 1.0).numpy()
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_size, stratify=labels, random_state=seed
    )
    return {
        "x_train": images[train_idx], "y_train": labels[train_idx], "train_idx": train_idx,
        "x_test": images[test_idx], "y_test": labels[test_idx], "test_idx": test_idx,
        "resolution": np.array(resolution),
    }  # fmt: skip


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
    """Linear warmup, then cosine decay to 10% over training ``progress`` in [0, 1] (time or steps)."""
    warm = min(1.0, (step + 1) / warmup_steps)
    return base_lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train_unet(
    out_dir: Path,
    x_train: np.ndarray,
    y_train: np.ndarray,
    minutes: float,
    resolution: int,
    seed: int,
    resume: bool,
    max_steps: int | None = None,
    batch_size: int = 64,
    lr: float = 1e-3,
    label_dropout: float = 0.1,
    snr_gamma: float | None = 5.0,
    checkpoint_every_s: float = 60.0,
    log_every: int = 20,
) -> tuple[UNet2DModel, dict]:
    """Time-budgeted DDPM training (accelerate, EMA, Min-SNR loss, JSONL log, atomic resumable checkpoints).

    Returns the EMA UNet (eval mode) and a summary (steps, elapsed_s, steps_per_s, final loss).
    """
    ckpt_path, log_path = out_dir / "checkpoint.pt", out_dir / "train_log.jsonl"
    torch.manual_seed(seed)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    unet = reference_unet(resolution)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=0.0)
    images = torch.as_tensor(x_train) * 2.0 - 1.0  # the model works in [-1, 1]
    loader = DataLoader(
        TensorDataset(images, torch.as_tensor(y_train)),
        batch_size=min(batch_size, len(images)),
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)
    ema = EMAModel(accelerator.unwrap_model(unet).parameters(), decay=0.999)
    noise_scheduler = training_scheduler()
    step, elapsed = 0, 0.0
    if resume and ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if state["resolution"] != resolution:
            raise ValueError(f"checkpoint has resolution {state['resolution']}, asked for {resolution}")
        accelerator.unwrap_model(unet).load_state_dict(state["unet"])
        optimizer.load_state_dict(state["optimizer"])
        ema.load_state_dict(state["ema"])
        step, elapsed = state["step"], state["elapsed_s"]
        torch.set_rng_state(state["rng"])
    elif not resume:
        log_path.unlink(missing_ok=True)
        ckpt_path.unlink(missing_ok=True)

    start_step, run_start, last_ckpt = step, time.perf_counter(), time.perf_counter()

    def elapsed_now() -> float:
        return elapsed + time.perf_counter() - run_start

    def save_checkpoint() -> None:
        state = {
            "unet": accelerator.unwrap_model(unet).state_dict(), "optimizer": optimizer.state_dict(),
            "ema": ema.state_dict(), "step": step, "elapsed_s": elapsed_now(), "rng": torch.get_rng_state(),
            "resolution": resolution,
        }  # fmt: skip
        _atomic_torch_save(state, ckpt_path)

    budget_s = minutes * 60.0
    recent_losses: list[float] = []

    def write_log_row() -> None:
        steps_per_s = (step - start_step) / max(time.perf_counter() - run_start, 1e-9)
        row = {
            "step": step, "loss": round(float(np.mean(recent_losses)), 5), "lr": optimizer.param_groups[0]["lr"],
            "elapsed_s": round(elapsed_now(), 2), "steps_per_s": round(steps_per_s, 3),
        }  # fmt: skip
        log.write(json.dumps(row) + "\n")
        log.flush()
        bar.set_postfix(step=step, loss=f"{row['loss']:.4f}", it_s=row["steps_per_s"])

    unet.train()
    bar = tqdm(
        total=round(budget_s), initial=min(round(elapsed), round(budget_s)), unit="s", desc="digits ddpm"
    )
    with log_path.open("a") as log:
        done = False
        while not done:
            for x0, labels in loader:
                progress = elapsed_now() / budget_s
                if max_steps is not None:
                    progress = max(progress, step / max_steps)
                done = progress >= 1.0
                if done:
                    break
                for group in optimizer.param_groups:
                    group["lr"] = _learning_rate(lr, step, progress)
                drop = torch.rand(labels.shape, device=labels.device) < label_dropout
                labels = torch.where(drop, torch.full_like(labels, NULL_CLASS), labels)
                noise = torch.randn_like(x0)
                t = torch.randint(
                    0, noise_scheduler.config.num_train_timesteps, (x0.shape[0],), device=x0.device
                )
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
                recent_losses = (recent_losses + [loss.item()])[-log_every:]
                if step % log_every == 0:
                    write_log_row()
                bar.update(min(round(elapsed_now()), round(budget_s)) - bar.n)
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
        "steps": step, "train_seconds": round(elapsed + run_seconds, 1), "batch_size": batch_size, "lr": lr,
        "snr_gamma": snr_gamma, "label_dropout": label_dropout,
        "session_steps_per_s": round((step - start_step) / max(run_seconds, 1e-9), 3),
        "final_loss": float(np.mean(recent_losses)) if recent_losses else None,
    }  # fmt: skip
    return ema_unet.eval(), summary


def build_reference(
    out_dir: str | Path,
    minutes: float = 12.0,
    resolution: int = 16,
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    max_steps: int | None = None,
    classifier_epochs: int = 30,
    fd_samples: int = 500,
    eval_per_class: int = 0,
    train_options: dict | None = None,
) -> Path:
    """Train the digits DDPM for ``minutes`` (and at most ``max_steps``), plus its evaluation classifier.

    ``resume=True`` continues from ``out_dir/checkpoint.pt`` until the total training time reaches
    ``minutes``, and reuses an existing classifier. ``threads`` sets torch's CPU threads for the build
    (None: unchanged; 1 is fastest on a machine oversubscribed by other work).
    ``train_options`` go to ``train_unet`` (batch_size, lr, label_dropout, snr_gamma, ...).
    ``eval_per_class > 0`` adds a DDIM-50 (trailing) sample check of that many images per digit to the report.

    Example::

        build_reference("/tmp/digits", minutes=0.2, classifier_epochs=3)
    """
    if minutes <= 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _build(Path(out_dir), minutes, resolution, seed, resume, max_steps, classifier_epochs, fd_samples,
                      eval_per_class, train_options)  # fmt: skip
    finally:
        torch.set_num_threads(previous_threads)


def _build(
    out: Path,
    minutes: float,
    resolution: int,
    seed: int,
    resume: bool,
    max_steps: int | None,
    classifier_epochs: int,
    fd_samples: int,
    eval_per_class: int,
    train_options: dict | None,
) -> Path:
    (out / "eval").mkdir(parents=True, exist_ok=True)
    split = digits_split(resolution, seed)
    split_path = out / "eval" / "split.npz"
    tmp = out / "eval" / "split.tmp.npz"
    np.savez_compressed(tmp, **split)
    os.replace(tmp, split_path)

    classifier_path = out / "eval" / "classifier.pt"
    start = time.perf_counter()
    if resume and classifier_path.is_file():
        classifier = load_classifier(classifier_path)
    else:
        classifier = train_classifier(split["x_train"], split["y_train"], epochs=classifier_epochs, seed=seed)
        save_classifier(classifier, classifier_path)
    classifier_seconds = time.perf_counter() - start

    unet, summary = train_unet(
        out,
        split["x_train"],
        split["y_train"],
        minutes,
        resolution,
        seed,
        resume,
        max_steps,
        **(train_options or {}),
    )
    pipe = ClassConditionalPipeline(unet=unet, scheduler=training_scheduler())
    pipe.save_pretrained(out)

    report = {
        "resolution": resolution, "seed": seed, "train": summary,
        "classifier_test_accuracy": classifier_accuracy(classifier, split["x_test"], split["y_test"]),
        "classifier_seconds": round(classifier_seconds, 1),
        f"fd_floor_{fd_samples}": fd_floor(split["x_train"], split["x_test"], classifier, n=fd_samples, seed=seed),
    }  # fmt: skip
    if eval_per_class > 0:
        pipe.scheduler = DDIMScheduler.from_config(
            pipe.scheduler.config, clip_sample=False, timestep_spacing="trailing"
        )
        images, labels = sample_digits(pipe, per_class=eval_per_class, steps=50, seed=seed)
        report["ddim50_trailing"] = {
            "samples": len(labels), "accuracy": accuracy(images, labels, classifier),
            "fd": fd(images, split["x_test"], classifier),
            "fd_floor": fd_floor(split["x_train"], split["x_test"], classifier, n=min(len(labels), 1437), seed=seed),
        }  # fmt: skip
    _atomic_write_text(json.dumps(report, indent=2), out / "eval" / "report.json")
    return out


def sample_digits(
    pipe: ClassConditionalPipeline,
    per_class: int = 50,
    steps: int = 50,
    guidance_scale: float = 1.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` images of each digit as (N,H,W,1) in [0, 1], with their labels.

    Example::

        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False)
        images, labels = sample_digits(pipe, per_class=5, steps=20)
    """
    labels = np.repeat(np.arange(NUM_CLASSES), per_class)
    generator = torch.Generator().manual_seed(seed)
    images = pipe(
        labels.tolist(),
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        generator=generator,
        output_type="np",
    ).images
    return images, labels


@register_model("digits", sizes=tuple(SIZES))
def build_digits(out_dir: Path, size: str = "bench", seed: int = 0) -> None:
    """Zoo builder: ``test`` is a ~1.5 minute build, ``bench`` the full one (<= 12 min of training)."""
    if size not in SIZES:
        raise ValueError(f"digits has no size {size!r}; allowed: {', '.join(SIZES)}")
    build_reference(out_dir, seed=seed, **SIZES[size])


__all__ = [
    "RESOLUTIONS", "NULL_CLASS", "NUM_CLASSES", "digits_split", "reference_unet", "training_scheduler",
    "train_unet", "build_reference", "sample_digits", "build_digits",
]  # fmt: skip
