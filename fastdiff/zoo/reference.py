"""The digits reference model: a small class-conditional DDPM trained here, fastdiff's quality yardstick.

Random-weight models cannot tell a good accelerator from a bad one; this one generates real digits, so
accuracy (by a separately trained classifier) and FD (on its features) measure what an accelerator costs.
One build (3000 steps, seed 0) ships with the package (``fastdiff.zoo.shipped``); ``build_reference`` retrains
it, for a fixed number of optimizer steps, so the result depends only on the seed and the step count.

Layout of a build directory::

    model_index.json, unet/, scheduler/     the ClassConditionalPipeline (EMA weights, DDPM, clip_sample=False)
    eval/classifier.pt, eval/split.npz      evaluation classifier and the fixed train/test split
    eval/report.json                        classifier test accuracy, fd_floor, training summary
    train_log.jsonl, checkpoint.pt          loss log and the resumable training state

Example::

    from fastdiff.zoo.reference import build_reference
    path = build_reference("/tmp/digits", steps=20, classifier_epochs=1)   # a toy build, for the flow
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler

from fastdiff.eval.classifier import classifier_accuracy, load_classifier, save_classifier, train_classifier
from fastdiff.eval.quality import accuracy, fd, fd_floor
from fastdiff.zoo.pipelines import ClassConditionalPipeline
from fastdiff.zoo.reference_train import (
    NULL_CLASS,
    NUM_CLASSES,
    _atomic_write_text,
    reference_unet,
    train_unet,
    training_scheduler,
)
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.shipped import install_digits

RESOLUTIONS = (16, 32)
TEST_SIZE = 360
BENCH_STEPS = (
    3000  # reaches FD ~ fd_floor; the shipped model (references/fastdiff_references/data/digits) is this build, seed 0
)
SIZES = {
    "test": dict(steps=200, classifier_epochs=8, eval_per_class=0),
    "bench": dict(steps=BENCH_STEPS, classifier_epochs=30, eval_per_class=50),
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
        "x_train": images[train_idx],
        "y_train": labels[train_idx],
        "train_idx": train_idx,
        "x_test": images[test_idx],
        "y_test": labels[test_idx],
        "test_idx": test_idx,
        "resolution": np.array(resolution),
    }


def build_reference(
    out_dir: str | Path,
    steps: int = BENCH_STEPS,
    resolution: int = 16,
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    classifier_epochs: int = 30,
    fd_samples: int = 500,
    eval_per_class: int = 0,
    train_options: dict | None = None,
    minutes: float | None = None,
) -> Path:
    """Train the digits DDPM for exactly ``steps`` optimizer steps, plus its evaluation classifier.

    The weights depend only on ``seed``, ``steps`` and the options, not on machine load; the build prints
    the measured rate and its estimated time, and shows a progress bar. ``resume=True`` continues from
    ``out_dir/checkpoint.pt`` up to ``steps`` in all (exactly as an uninterrupted run would) and reuses an
    existing classifier. ``threads`` sets torch's CPU threads for the build (None: unchanged).
    ``train_options`` go to ``train_unet`` (batch_size, lr, label_dropout, snr_gamma, ...).
    ``eval_per_class > 0`` adds a DDIM-50 (trailing) sample check of that many images per digit to the report.
    ``minutes`` (the old time budget) is refused: it made the model depend on how busy the machine was.

    Example::

        build_reference("/tmp/digits", steps=5, classifier_epochs=1, threads=1)
    """
    if minutes is not None:
        raise ValueError(
            "the time budget (minutes) was removed: the reference now trains a fixed number of optimizer "
            f"steps, so its result depends only on seed and steps; pass steps=N (bench: {BENCH_STEPS})"
        )
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _build(
            Path(out_dir),
            steps,
            resolution,
            seed,
            resume,
            classifier_epochs,
            fd_samples,
            eval_per_class,
            train_options,
        )
    finally:
        torch.set_num_threads(previous_threads)


def _build(
    out: Path,
    steps: int,
    resolution: int,
    seed: int,
    resume: bool,
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
        steps,
        resolution,
        seed,
        resume,
        **(train_options or {}),
    )
    pipe = ClassConditionalPipeline(unet=unet, scheduler=training_scheduler())
    pipe.save_pretrained(out)

    report = {
        "resolution": resolution,
        "seed": seed,
        "train": summary,
        "classifier_test_accuracy": classifier_accuracy(classifier, split["x_test"], split["y_test"]),
        "classifier_seconds": round(classifier_seconds, 1),
        f"fd_floor_{fd_samples}": fd_floor(split["x_train"], split["x_test"], classifier, n=fd_samples, seed=seed),
    }
    if eval_per_class > 0:
        pipe.scheduler = DDIMScheduler.from_config(
            pipe.scheduler.config, clip_sample=False, timestep_spacing="trailing"
        )
        images, labels = sample_digits(pipe, per_class=eval_per_class, steps=50, seed=seed)
        report["ddim50_trailing"] = {
            "samples": len(labels),
            "accuracy": accuracy(images, labels, classifier),
            "fd": fd(images, split["x_test"], classifier),
            "fd_floor": fd_floor(split["x_train"], split["x_test"], classifier, n=min(len(labels), 1437), seed=seed),
        }
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
def build_digits(out_dir: Path, size: str = "bench", seed: int = 0, retrain: bool = False) -> None:
    """Zoo builder: ``bench`` (seed 0) copies the shipped, hash-checked model instantly; ``test`` trains
    200 steps (about a minute); ``retrain=True`` or another seed trains (``bench``: 3000 steps, ~15-25 min).

    Example::

        build_digits(Path("/tmp/digits"), size="bench")   # the shipped reference, in well under a second
    """
    if size not in SIZES:
        raise ValueError(f"digits has no size {size!r}; allowed: {', '.join(SIZES)}")
    if size == "bench" and seed == 0 and not retrain:
        install_digits(out_dir)
        return
    build_reference(out_dir, seed=seed, **SIZES[size])


__all__ = [
    "RESOLUTIONS",
    "BENCH_STEPS",
    "SIZES",
    "NULL_CLASS",
    "NUM_CLASSES",
    "digits_split",
    "reference_unet",
    "training_scheduler",
    "train_unet",
    "build_reference",
    "sample_digits",
    "build_digits",
]
