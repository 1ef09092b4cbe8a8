"""Moving digits: the clips, captions and metrics of the ``moving-digits`` video reference.

A clip is one 16 px digit of the digits reference's split sliding two pixels per frame across a 32 px canvas
for 9 frames (16 px in all: edge to edge), left, right, up or down, centred on the other axis; its caption names the digit
and the direction ("a handwritten seven moving left"). The metrics read each generated frame the way the
digits reference reads an image: the 16 px window around the frame's centre of ink goes to the digits
classifier (per-frame accuracy against the prompt's digit; FD of all windows against the real test clips'
windows, beside the floor: as many whole real train clips of the prompts' digits and directions against them), the centre's path gives the motion direction,
and the mean frame-to-frame change against the real clips' gives temporal consistency (1.0 = as smooth as
the real clips; above 1: flicker; below 1: too still).

Example::

    import numpy as np
    from fastdiff.zoo.moving_digits import make_clip, video_metrics_real

    clip = make_clip(np.ones((16, 16), np.float32), "left")   # (9, 32, 32)
"""

from __future__ import annotations

import re

import numpy as np
import torch

from fastdiff.eval.floor import FLOOR_DRAWS
from fastdiff.zoo.digit_captions import DIGIT_WORDS, caption, digit_of

CANVAS, DIGIT, FRAMES = 32, 16, 9  # Wan takes sides that are multiples of 16
TRAVEL = CANVAS - DIGIT  # 16 px: two per frame step
DIRECTIONS = ("left", "right", "up", "down")
_STEP = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}  # (row, column) per frame
TEMPLATES = (
    "a handwritten {word} moving {dir}",
    "the digit {n} moving {dir}",
    "{word} moving {dir}",
    "the number {word} sliding {dir}",
    "digit {n} going {dir}",
    "a {word} that moves {dir}",
)
BENCH_TEMPLATES = ("a handwritten {word} moving {dir}", "the digit {n} moving {dir}")
EXTRA_WORDS = "moving sliding going moves that " + " ".join(DIRECTIONS)


def make_clip(digit: np.ndarray, direction: str) -> np.ndarray:
    """(FRAMES, CANVAS, CANVAS) float32: ``digit`` (16x16 in [0, 1]) sliding in ``direction``."""
    if direction not in _STEP:
        raise ValueError(f"unknown direction {direction!r}; allowed: {', '.join(DIRECTIONS)}")
    dy, dx = _STEP[direction]
    clip = np.zeros((FRAMES, CANVAS, CANVAS), np.float32)
    for t in range(FRAMES):
        step = t * TRAVEL // (FRAMES - 1)
        y = TRAVEL // 2 if dy == 0 else (step if dy > 0 else TRAVEL - step)
        x = TRAVEL // 2 if dx == 0 else (step if dx > 0 else TRAVEL - step)
        clip[t, y : y + DIGIT, x : x + DIGIT] = digit
    return clip


def make_clips(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (image, direction) pair of ``images`` (N,1,16,16): clips (4N, FRAMES, 32, 32) and direction ids."""
    clips = [make_clip(image[0], d) for image in images for d in DIRECTIONS]
    return np.stack(clips), np.tile(np.arange(len(DIRECTIONS)), len(images))


def video_caption(template: str, digit: int, direction: str) -> str:
    return caption(template.replace("{dir}", direction), digit)


def direction_of(prompt: str) -> str:
    """The direction a prompt names; ValueError if it names none or several."""
    found = {w for w in re.findall(r"[a-z]+", prompt.lower()) if w in _STEP}
    if len(found) != 1:
        raise ValueError(f"prompt {prompt!r} must name exactly one direction of {DIRECTIONS}, found {sorted(found)}")
    return found.pop()


def training_prompts(labels: np.ndarray, directions: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Every caption a clip may get and each clip's caption ids (id 0: the empty prompt, for prompt dropout)."""
    table: dict[str, int] = {"": 0}
    allowed = [
        [table.setdefault(video_caption(t, int(d), DIRECTIONS[k]), len(table)) for t in TEMPLATES]
        for d, k in zip(np.asarray(labels).tolist(), np.asarray(directions).tolist())
    ]
    return list(table), np.array(allowed)


def bench_prompts() -> list[str]:
    """The prompts ``fastdiff bench`` cycles through: every digit in every direction, two phrasings (80)."""
    return [video_caption(t, d, k) for t in BENCH_TEMPLATES for k in DIRECTIONS for d in range(10)]


def gray_frames(frames) -> np.ndarray:
    """(N, F, H, W) in [0, 1] from the pipeline's ``output_type="np"`` frames (N, F, H, W, C)."""
    x = np.asarray(frames, dtype=np.float32)
    return x.mean(-1) if x.ndim == 5 else x


def ink_centres(gray: np.ndarray) -> np.ndarray:
    """(N, F, 2) centre of ink (row, column) of each frame; the canvas centre for an empty frame."""
    ink = np.clip(gray, 0.0, None)
    total = ink.sum((-2, -1))
    rows, cols = np.arange(gray.shape[-2], dtype=np.float32), np.arange(gray.shape[-1], dtype=np.float32)
    centre = np.stack([(ink.sum(-1) * rows).sum(-1), (ink.sum(-2) * cols).sum(-1)], -1)
    middle = np.array([(gray.shape[-2] - 1) / 2, (gray.shape[-1] - 1) / 2], np.float32)
    return np.where(total[..., None] > 1e-6, centre / np.maximum(total[..., None], 1e-6), middle)


def digit_windows(gray: np.ndarray) -> np.ndarray:
    """(N*F, 1, 16, 16): each frame's 16 px window centred on its ink (clamped inside the canvas)."""
    centres = ink_centres(gray).reshape(-1, 2)
    flat = gray.reshape(-1, *gray.shape[-2:])
    limit = np.array(flat.shape[-2:]) - DIGIT
    corners = np.clip(np.rint(centres - (DIGIT - 1) / 2), 0, limit).astype(int)
    return np.stack([f[y : y + DIGIT, x : x + DIGIT] for f, (y, x) in zip(flat, corners)])[:, None]


def motion_directions(gray: np.ndarray) -> list[str]:
    """The direction each clip's centre of ink travels from its first to its last frame."""
    move = ink_centres(gray)[:, -1] - ink_centres(gray)[:, 0]  # (N, 2): rows, columns
    scores = np.stack([-move[:, 1], move[:, 1], -move[:, 0], move[:, 0]], -1)
    return [DIRECTIONS[i] for i in scores.argmax(-1)]


def temporal_change(gray: np.ndarray) -> float:
    """Mean absolute change between consecutive frames."""
    return float(np.abs(np.diff(gray, axis=1)).mean())


def matched_real_clips(
    prompts: list[str], x_train: np.ndarray, y_train: np.ndarray, seed: int = 0, draw: int = 0
) -> np.ndarray:
    """Real clips like-for-like with generated ``prompts``: clip ``i`` is a distinct train image of prompt ``i``'s
    digit sliding in prompt ``i``'s direction (same count, same digit and direction mix); ``draw`` of ``seed``."""
    from fastdiff.eval.floor import draw_rng, matched_draw

    digits = np.array([digit_of(p) for p in prompts])
    idx, _ = matched_draw(digits, np.asarray(y_train), draw_rng(seed, draw))
    return np.stack([make_clip(x_train[i, 0], direction_of(p)) for i, p in zip(idx, prompts)])


def clip_floor_draws(
    prompts: list[str], x_train: np.ndarray, y_train: np.ndarray, classifier, seed: int = 0, draws: int = FLOOR_DRAWS
) -> list[torch.Tensor]:
    """Classifier features (clips, frames, dim) of ``draws`` like-for-like real samples for ``prompts``
    (:func:`matched_real_clips`, draws 0, 1, ... of ``seed``): the floor's side of the ratio.

    Whole clips matched to the prompts, not loose frames: a clip's frames show one digit, so ``n`` clips carry
    ``n`` digits however many frames they have; a floor of as many random frames (about 5x more digits at 9
    frames), or of a random mix of digits and directions, sits below what a perfect generator reaches.

    Example::

        clip_floor_draws(bench_prompts()[:40], ref.x_train, ref.y_train, ref.classifier)
    """
    from fastdiff.eval.fd_spread import classifier_features

    if len(prompts) < 2:
        raise ValueError(f"the floor needs at least 2 clips, got {len(prompts)}")
    out = []
    for draw in range(draws):
        clips = matched_real_clips(prompts, x_train, y_train, seed, draw)
        out.append(classifier_features(digit_windows(clips), classifier).reshape(len(clips), FRAMES, -1))
    return out


def video_metrics(
    gray: np.ndarray,
    prompts: list[str],
    reference,
    real_test: np.ndarray,
    seed: int = 0,
    floor_draws: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Per-frame digit accuracy, direction accuracy, FD over frames, the like-for-like floor with FD / floor and
    its interval (:func:`fastdiff.eval.floor.ratio_to_floor`), temporal consistency.

    ``reference``: the digits reference's ``ReferenceEval`` (its classifier and train split); ``real_test``: real
    test clips (N, F, H, W) for the FD and the temporal scale; ``floor_draws``: :func:`clip_floor_draws` for these
    prompts and ``seed`` if already known (the scorer caches them).
    """
    from fastdiff.eval.fd_spread import classifier_features
    from fastdiff.eval.floor import ratio_to_floor
    from fastdiff.eval.quality import accuracy, fd

    if len(prompts) != len(gray):
        raise ValueError(f"got {len(gray)} clips for {len(prompts)} prompts (one clip per prompt is scored)")
    digits = np.repeat([digit_of(p) for p in prompts], gray.shape[1])
    windows, test_windows = digit_windows(gray), digit_windows(real_test)
    moved = motion_directions(gray)
    classifier = reference.classifier
    real_change = temporal_change(real_test)
    if floor_draws is None:
        floor_draws = clip_floor_draws(prompts, reference.x_train, reference.y_train, classifier, seed)
    fd_value = fd(windows, test_windows, classifier)
    generated = classifier_features(windows, classifier).reshape(len(gray), gray.shape[1], -1)
    floor = ratio_to_floor(generated, floor_draws, classifier_features(test_windows, classifier), seed=seed)
    floor.pop("fd_gen_features")
    return {
        "accuracy": accuracy(windows, digits, classifier),
        "direction_accuracy": float(np.mean([m == direction_of(p) for m, p in zip(moved, prompts)])),
        "fd": fd_value,
        **floor,
        "temporal_change": temporal_change(gray),
        "temporal_ratio": temporal_change(gray) / real_change,
    }


def video_metrics_real(x: np.ndarray, y: np.ndarray, reference) -> dict[str, float]:
    """The metrics' ceiling: per-frame and direction accuracy of the real clips of images ``x`` labelled ``y``."""
    clips, directions = make_clips(x)
    prompts = [video_caption(BENCH_TEMPLATES[0], int(d), DIRECTIONS[k]) for d, k in zip(np.repeat(y, 4), directions)]
    from fastdiff.eval.quality import accuracy

    digits = np.repeat([digit_of(p) for p in prompts], FRAMES)
    moved = motion_directions(clips)
    return {
        "accuracy": accuracy(digit_windows(clips), digits, reference.classifier),
        "direction_accuracy": float(np.mean([m == direction_of(p) for m, p in zip(moved, prompts)])),
    }


def as_video_tensor(clips: np.ndarray) -> torch.Tensor:
    """(N, F, H, W) in [0, 1] -> the VAE's (N, 3, F, H, W) in [-1, 1]."""
    x = torch.as_tensor(clips, dtype=torch.float32)[:, None].expand(-1, 3, -1, -1, -1)
    return x * 2.0 - 1.0


__all__ = [
    "CANVAS",
    "DIGIT",
    "FRAMES",
    "DIRECTIONS",
    "TEMPLATES",
    "BENCH_TEMPLATES",
    "EXTRA_WORDS",
    "DIGIT_WORDS",
    "make_clip",
    "make_clips",
    "video_caption",
    "direction_of",
    "training_prompts",
    "bench_prompts",
    "gray_frames",
    "ink_centres",
    "digit_windows",
    "motion_directions",
    "temporal_change",
    "matched_real_clips",
    "clip_floor_draws",
    "video_metrics",
    "video_metrics_real",
    "as_video_tensor",
]
