"""The reference models' quality evaluators, registered per pipeline class (``fastdiff.eval.registry``).

``fastdiff.eval.quality_for`` loads this module through the ``fastdiff.quality`` entry point (pyproject.toml), so
the evaluation layer names no reference model: digits (``ClassConditionalPipeline``), digits-sd and digits-flow
(``StableDiffusionPipeline``, ``StableDiffusion3Pipeline``) and moving-digits (``WanPipeline``). Each returns {} for
a pipeline of its class that is not a reference (no bench prompts). The same entry point registers which digit a
digits-sd or digits-flow prompt names (``fastdiff.train.data.prompt_labels``: the GAN head of ``fastdiff distill dmd
--gan-prompts`` reads each training image with a prompt naming its digit).

Example::

    from fastdiff.eval import quality_for

    scores = quality_for(pipe)(pipe, kwargs, pipe(**kwargs, output_type="np").images, seed=0)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from fastdiff.core.inputs import model_prompts, pipeline_directory
from fastdiff.eval.quality import digits_quality, load_reference_eval
from fastdiff.eval.registry import register_quality
from fastdiff.train.data import register_prompt_labels
from fastdiff.zoo import moving_digits as md
from fastdiff.zoo.digit_captions import digit_of

register_quality("ClassConditionalPipeline")(digits_quality)  # digits


@register_quality("StableDiffusion3Pipeline")  # digits-flow
@register_quality("StableDiffusionPipeline")  # digits-sd
def digits_sd_quality(pipe, call_kwargs: dict, images: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Accuracy (label: the digit each prompt names), FD and FD floor for digits-sd and digits-flow; {} for other
    models of their classes (they ship no bench prompts).

    Example::

        kwargs = {"prompt": ["a handwritten seven", "the digit 3"] * 50, "guidance_scale": 5.0}
        digits_sd_quality(pipe, kwargs, pipe(**kwargs, output_type="np").images)
    """
    if model_prompts(pipe) is None:
        return {}
    prompts = call_kwargs.get("prompt")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
    if len(prompts) != len(images):
        raise ValueError(f"got {len(images)} images for {len(prompts)} prompts (one image per prompt is scored)")
    return digits_quality(pipe, {"class_labels": [digit_of(p) for p in prompts]}, images, seed)


@register_prompt_labels("StableDiffusion3Pipeline")  # digits-flow
@register_prompt_labels("StableDiffusionPipeline")  # digits-sd
def digits_prompt_labels(pipe, prompts: list[str]) -> list[int] | None:
    """The digit each prompt names (the training label of the split's images), or None for other models of these
    classes. Example: ``digits_prompt_labels(pipe, ["a handwritten seven"])`` -> [7]."""
    return [digit_of(p) for p in prompts] if model_prompts(pipe) is not None else None


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
    return md.video_metrics(
        md.gray_frames(frames),
        prompts,
        load_reference_eval(directory),
        _real_test_clips(directory),
        seed,
        _floor_draws(directory, tuple(prompts), seed),
    )


__all__ = ["digits_quality", "digits_sd_quality", "moving_digits_quality"]
