"""Noise-aware classifier p(y | x_t, t) for classifier guidance: the model, its training, saving and loading.

``NoisyClassifier`` is a small half-UNet (Dhariwal & Nichol 2021, "Diffusion models beat GANs"): diffusers'
``ResnetBlock2D`` blocks conditioned on a sinusoidal timestep embedding, then a pooled linear head. It sees
what the denoiser sees: ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps`` in the model's [-1, 1] space, at
any (also fractional) timestep. ``train_noisy_classifier`` trains it for a fixed number of seeded steps on
the model's training data, noised by the model's own scheduler at uniformly drawn timesteps; the saved file
records that schedule so guidance refuses a model whose noise levels differ.

Example::

    import numpy as np
    from fastdiff.guidance.noisy_classifier import train_noisy_classifier, save_noisy_classifier
    from fastdiff.zoo.reference_train import training_scheduler

    x = np.random.rand(64, 1, 16, 16).astype("float32"); y = np.arange(64) % 10
    model, report = train_noisy_classifier(x, y, training_scheduler().config, steps=5, batch_size=16)
    save_noisy_classifier(model, "/tmp/noisy.pt", report)
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from diffusers import DDPMScheduler
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from diffusers.models.resnet import Downsample2D, ResnetBlock2D
from torch import nn
from tqdm.auto import tqdm

# Scheduler config keys that fix the noise levels a classifier was trained on.
SCHEDULE_KEYS = (
    "num_train_timesteps",
    "beta_start",
    "beta_end",
    "beta_schedule",
    "trained_betas",
    "rescale_betas_zero_snr",
)


class NoisyClassifierError(ValueError):
    """A noise-aware classifier file is missing, unreadable, or does not fit the model."""


class NoisyClassifier(nn.Module):
    """conv_in -> [ResnetBlock2D(t) -> downsample] per width -> GroupNorm/SiLU -> mean pool -> linear.

    Input: (N, C, H, W) noisy samples in the model space and (N,) or scalar timesteps; output: logits.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        widths: tuple[int, ...] = (16, 32, 64),
        groups: int = 8,
        sample_size: int = 16,
    ):
        super().__init__()
        widths = tuple(widths)
        self.config = {
            "in_channels": in_channels,
            "num_classes": num_classes,
            "widths": list(widths),
            "groups": groups,
            "sample_size": sample_size,
        }
        temb = 4 * widths[0]
        self.time_proj = Timesteps(widths[0], flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embedding = TimestepEmbedding(widths[0], temb)
        self.conv_in = nn.Conv2d(in_channels, widths[0], 3, padding=1)
        blocks, downs, channels = [], [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(ResnetBlock2D(in_channels=channels, out_channels=width, temb_channels=temb, groups=groups))
            last = i == len(widths) - 1
            downs.append(nn.Identity() if last else Downsample2D(width, use_conv=True))
            channels = width
        self.blocks, self.downs = nn.ModuleList(blocks), nn.ModuleList(downs)
        self.norm_out = nn.GroupNorm(groups, channels)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | float) -> torch.Tensor:
        t = torch.as_tensor(timestep, dtype=torch.float32, device=sample.device).reshape(-1)
        t = t.expand(sample.shape[0]) if t.numel() == 1 else t
        emb = self.time_embedding(self.time_proj(t).to(sample.dtype))
        h = self.conv_in(sample)
        for block, down in zip(self.blocks, self.downs):
            h = down(block(h, emb))
        h = F.silu(self.norm_out(h)).mean(dim=(2, 3))
        return self.head(h)


def schedule_of(config) -> dict:
    """The noise-schedule part of a scheduler config (what a classifier must match); unset keys left out."""
    return {k: _plain(config[k]) for k in SCHEDULE_KEYS if config.get(k) is not None}


def alphas_cumprod(config) -> torch.Tensor:
    """abar_t for t = 0..T-1 of a scheduler config (any diffusers scheduler with betas)."""
    return DDPMScheduler.from_config(schedule_of(config)).alphas_cumprod


def same_schedule(a, b) -> bool:
    """Whether two scheduler configs give the same noise levels."""
    first, second = alphas_cumprod(a), alphas_cumprod(b)
    return first.shape == second.shape and torch.allclose(first, second, rtol=1e-5, atol=1e-7)


def _plain(value):
    return list(value) if isinstance(value, (tuple, np.ndarray)) else value


def train_noisy_classifier(
    x_train: np.ndarray,
    y_train: np.ndarray,
    scheduler_config,
    steps: int = 3000,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    widths: tuple[int, ...] = (16, 32, 64),
    shift_pixels: int = 1,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
) -> tuple[NoisyClassifier, dict]:
    """Train p(y | x_t, t) on images in [0, 1] (N, C, H, W) noised by ``scheduler_config``'s schedule.

    Exactly ``steps`` AdamW steps (warmup + cosine, accelerate loop); batches, timesteps and noise come from
    generators seeded by ``seed``, so the weights depend only on the seed, the steps and the data. With a test
    split, the report holds test accuracy at several timesteps. Returns the classifier (eval mode, frozen).

    Example::

        model, report = train_noisy_classifier(split["x_train"], split["y_train"], pipe.scheduler.config)
    """
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    x = torch.as_tensor(np.asarray(x_train), dtype=torch.float32) * 2.0 - 1.0  # the model's [-1, 1] space
    y = torch.as_tensor(np.asarray(y_train)).long()
    if x.ndim != 4 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need images (N,C,H,W) and N labels, got {tuple(x.shape)} and {tuple(y.shape)}")
    torch.manual_seed(seed)
    noise_scheduler = DDPMScheduler.from_config(scheduler_config)
    T = noise_scheduler.config.num_train_timesteps
    model = NoisyClassifier(x.shape[1], int(y.max()) + 1, widths, sample_size=x.shape[-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    warmup = min(100, steps // 10 + 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    generator = torch.Generator().manual_seed(seed)
    batch_size = min(batch_size, len(x))
    start, losses = time.perf_counter(), []
    model.train()
    for _ in tqdm(range(steps), desc="noisy classifier", unit="step", leave=False):
        index = torch.randint(0, len(x), (batch_size,), generator=generator)
        x0, labels = x[index], y[index]
        if shift_pixels:  # small translations: generated digits are not perfectly centred
            dx, dy = torch.randint(-shift_pixels, shift_pixels + 1, (2,), generator=generator).tolist()
            x0 = torch.roll(x0, shifts=(dy, dx), dims=(2, 3))
        t = torch.randint(0, T, (batch_size,), generator=generator)
        noisy = noise_scheduler.add_noise(x0, torch.randn(x0.shape, generator=generator), t)
        noisy, labels, t = (v.to(accelerator.device) for v in (noisy, labels, t))
        loss = F.cross_entropy(model(noisy, t), labels)
        accelerator.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model = accelerator.unwrap_model(model).cpu().eval().requires_grad_(False)
    report = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "widths": list(widths),
        "train_seconds": round(time.perf_counter() - start, 1),
        "final_loss": round(float(np.mean(losses[-50:])), 4),
        "train_size": len(x),
        "schedule": schedule_of(noise_scheduler.config),
    }
    if x_test is not None and y_test is not None:
        report["test_accuracy_by_t"] = accuracy_by_timestep(model, x_test, y_test, scheduler_config, seed)
    return model, report


@torch.no_grad()
def accuracy_by_timestep(
    model: NoisyClassifier,
    images: np.ndarray,
    labels: np.ndarray,
    scheduler_config,
    seed: int = 0,
    timesteps=(0, 100, 250, 500, 750, 900, 999),
) -> dict[str, float]:
    """Accuracy on images in [0, 1] noised to each timestep (one seeded noise draw per timestep).

    Example::

        accuracy_by_timestep(model, split["x_test"], split["y_test"], pipe.scheduler.config)
    """
    noise_scheduler = DDPMScheduler.from_config(scheduler_config)
    x0 = torch.as_tensor(np.asarray(images), dtype=torch.float32) * 2.0 - 1.0
    y = torch.as_tensor(np.asarray(labels)).long()
    generator, out = torch.Generator().manual_seed(seed), {}
    for step in timesteps:
        t = torch.full((len(x0),), step)
        noisy = noise_scheduler.add_noise(x0, torch.randn(x0.shape, generator=generator), t)
        out[str(step)] = round(float((model(noisy, t).argmax(1) == y).float().mean()), 4)
    return out


def save_noisy_classifier(model: NoisyClassifier, path: str | Path, report: dict) -> Path:
    """Save config, weights and training report atomically (temp file then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(
        {
            "kind": "fastdiff-noisy-classifier",
            "config": model.config,
            "report": report,
            "state_dict": model.state_dict(),
        },
        tmp,
    )
    os.replace(tmp, path)
    return path


def load_noisy_classifier(path: str | Path) -> tuple[NoisyClassifier, dict]:
    """(classifier in eval mode with frozen weights, training report) from ``save_noisy_classifier``'s file.

    Example::

        model, report = load_noisy_classifier("/tmp/digits/noisy_classifier.pt")
    """
    path = Path(path)
    hint = "train one with `fastdiff train-classifier MODEL OUT`"
    if not path.is_file():
        raise NoisyClassifierError(f"no noise-aware classifier at {path}; {hint}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated file, not a torch file ...
        raise NoisyClassifierError(f"{path} is not a readable classifier file ({exc}); {hint}") from exc
    if not isinstance(saved, dict) or saved.get("kind") != "fastdiff-noisy-classifier":
        raise NoisyClassifierError(f"{path} is not a noise-aware classifier saved by fastdiff; {hint}")
    model = NoisyClassifier(**saved["config"])
    model.load_state_dict(saved["state_dict"])
    return model.eval().requires_grad_(False), saved["report"]


__all__ = [
    "NoisyClassifier",
    "NoisyClassifierError",
    "SCHEDULE_KEYS",
    "schedule_of",
    "alphas_cumprod",
    "same_schedule",
    "train_noisy_classifier",
    "accuracy_by_timestep",
    "save_noisy_classifier",
    "load_noisy_classifier",
]
