"""Quality of the moving-digits video reference: per-frame digit accuracy, direction accuracy, FD over frames
(with its floor) and temporal consistency (:func:`fastdiff.zoo.moving_digits.video_metrics`).

Example::

    kwargs = {"prompt": ["a handwritten seven moving left"] * 20, "height": 24, "width": 24, "num_frames": 9}
    moving_digits_quality(pipe, kwargs, pipe(**kwargs, output_type="np").frames)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from fastdiff.core.inputs import model_prompts, pipeline_directory
from fastdiff.eval.quality import load_reference_eval
from fastdiff.eval.registry import register_quality
from fastdiff.zoo import moving_digits as md


@lru_cache(maxsize=4)
def _real_clips(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    ref = load_reference_eval(directory)
    return md.make_clips(ref.x_test)[0], md.make_clips(ref.x_train)[0]


@lru_cache(maxsize=8)
def _clip_floor(directory: Path, clips: int, seed: int) -> float:
    # the same for every config a benchmark scores (about 12 s on 2 cores): computed once per clip count
    real_test, real_train = _real_clips(directory)
    classifier = load_reference_eval(directory).classifier
    return md.clip_fd_floor(real_train, md.digit_windows(real_test), classifier, clips=clips, seed=seed)


@register_quality("WanPipeline")  # moving-digits
def moving_digits_quality(pipe, call_kwargs: dict, frames: np.ndarray, seed: int = 0) -> dict[str, float]:
    """The moving-digits metrics of ``frames`` (N, F, H, W, C); {} for Wan pipelines without bench prompts."""
    if model_prompts(pipe) is None:
        return {}
    prompts = call_kwargs.get("prompt")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
    directory = pipeline_directory(pipe).resolve()
    real_test, real_train = _real_clips(directory)
    floor = _clip_floor(directory, len(frames), seed)
    return md.video_metrics(md.gray_frames(frames), prompts, load_reference_eval(directory), real_test, real_train,
                            seed, floor)  # fmt: skip


__all__ = ["moving_digits_quality"]
