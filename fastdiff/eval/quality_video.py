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
def _real_test_clips(directory: Path) -> np.ndarray:
    return md.make_clips(load_reference_eval(directory).x_test)[0]


@lru_cache(maxsize=8)
def _floor_draws(directory: Path, prompts: tuple[str, ...], seed: int) -> list:
    # the same for every config a benchmark scores: drawn once per prompt list and seed
    ref = load_reference_eval(directory)
    return md.clip_floor_draws(list(prompts), ref.x_train, ref.y_train, ref.classifier, seed)


@register_quality("WanPipeline")  # moving-digits
def moving_digits_quality(pipe, call_kwargs: dict, frames: np.ndarray, seed: int = 0) -> dict[str, float]:
    """The moving-digits metrics of ``frames`` (N, F, H, W, C); {} for Wan pipelines without bench prompts."""
    if model_prompts(pipe) is None:
        return {}
    prompts = call_kwargs.get("prompt")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
    directory = pipeline_directory(pipe).resolve()
    return md.video_metrics(md.gray_frames(frames), prompts, load_reference_eval(directory),
                            _real_test_clips(directory), seed, _floor_draws(directory, tuple(prompts), seed))  # fmt: skip


__all__ = ["moving_digits_quality"]
