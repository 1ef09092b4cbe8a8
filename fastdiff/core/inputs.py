"""Call arguments for a benchmark batch of any supported pipeline, from its facts (``fastdiff.core.models``).

Every layer that runs a pipeline on made-up inputs (bench, compression calibration, training captures,
schedule tuning, the XLA driver) takes them from here, so all of them call a model the same way.

Example::

    from fastdiff.core.inputs import make_inputs
    images = pipe(**make_inputs(pipe, batch=2), num_inference_steps=4, output_type="np").images
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdiff.core.models import (
    PIPELINES,
    UnsupportedModelError,
    find_denoiser,
    pipeline_facts,
    spatial_factor,
)

PROMPTS = [
    "a photograph of an astronaut riding a horse",
    "a watercolor painting of a fox in a snowy forest",
    "a red vintage car parked on a cobblestone street",
    "a bowl of fruit on a wooden table, studio lighting",
]


def make_inputs(
    pipe, batch: int | None = None, guidance: float | None = None, side: int | None = None
) -> dict[str, Any]:
    """Call arguments for a benchmark batch, from the pipeline's facts (prompts, labels or a batch size).

    Pipelines that take images (img2img, inpaint, ControlNet, T2I-Adapter) get seeded synthetic ones of
    ``side`` pixels (default: the model's default size).
    """
    facts = pipeline_facts(pipe)
    batch = batch or facts.default_batch
    if facts.inputs == "prompt":
        # a model may ship its own prompts (digits-sd: prompts naming digits)
        prompts = model_prompts(pipe) or PROMPTS
        kwargs: dict[str, Any] = {"prompt": [prompts[i % len(prompts)] for i in range(batch)]}
    elif facts.inputs == "class_labels":
        kwargs = {"class_labels": [i % facts.num_classes for i in range(batch)]}
    else:
        kwargs = {"batch_size": batch}
    if guidance is None:  # the model's own bench guidance (digits-flow), else the pipeline's default
        guidance = model_eval_settings(pipe).get("guidance", facts.default_guidance)
    if facts.cfg_layout:
        kwargs["guidance_scale"] = guidance
    elif facts.cfg_sequence:  # true CFG (Flux, Qwen-Image) runs only with a negative prompt
        kwargs[facts.guidance_arg] = guidance
        takes_negative = "negative_prompt" in inspect.signature(pipe.__call__).parameters
        if kwargs[facts.guidance_arg] > facts.cfg_above and takes_negative:
            kwargs["negative_prompt"] = [" "] * batch
    kwargs.update(facts.bench_call)
    declared = model_call(pipe)  # a model's own benchmark call: side (square) and clip length
    if "height" in inspect.signature(pipe.__call__).parameters:
        side = side or declared.get("height") or default_side(pipe)
        kwargs.update(height=side, width=side)
    kwargs.update({k: v for k, v in declared.items() if k not in ("height", "width")})
    if facts.image_inputs:
        side = side or default_side(pipe)
        for i, name in enumerate(facts.image_inputs):
            image = synthetic_image(side, side, seed=i, mask=name == "mask_image")
            kwargs[name] = image if batch == 1 else [image] * batch  # one per prompt (T2I-Adapter needs it)
    return kwargs


def default_side(pipe) -> int:
    """The image side a pipeline generates by default: its default sample size times the VAE's factor.

    Where the pipeline keeps none, the facts say where it is (``sample_size_key``, ``default_height``)."""
    _, denoiser = find_denoiser(pipe)
    facts = PIPELINES.get(type(pipe).__name__)
    key = facts.sample_size_key if facts else "sample_size"
    sample = getattr(pipe, "default_sample_size", None) or denoiser.config.get(key)
    if sample is None:  # video transformers keep no sample size: the call's own default height
        height = inspect.signature(pipe.__call__).parameters["height"].default
        height = height or (facts.default_height if facts else None)
        if not height:
            raise UnsupportedModelError(
                f"{type(pipe).__name__} keeps no default image size (no default_sample_size, no {key} in its "
                f"{type(denoiser).__name__}'s config, no default height): pass height and width"
            )
        return int(height)
    if isinstance(sample, (tuple, list)):
        sample = sample[0]
    return int(sample * spatial_factor(pipe))


def synthetic_image(height: int, width: int, seed: int = 0, mask: bool = False) -> Image.Image:
    """A seeded noise image (RGB), or a mask (L) that is white in its central half, for image-taking pipelines."""
    if mask:
        pixels = np.zeros((height, width), np.uint8)
        pixels[height // 4 : height - height // 4, width // 4 : width - width // 4] = 255
        return Image.fromarray(pixels)
    return Image.fromarray((np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8))


def pipeline_directory(pipe) -> Path:
    """The directory a pipeline was loaded from (``from_pretrained`` records it as ``_name_or_path``)."""
    path = getattr(pipe, "name_or_path", None) or getattr(pipe.config, "_name_or_path", None)
    if not path or not Path(path).is_dir():
        raise ValueError(
            f"cannot find the directory of pipeline {type(pipe).__name__} (name_or_path={path!r}); "
            "load it with from_pretrained(<local build directory>)"
        )
    return Path(path)


def model_eval_settings(pipe) -> dict:
    """What a model directory's ``eval/prompts.json`` says about benchmarking it: ``bench_prompts`` (digits-sd,
    digits-flow) and optionally ``guidance`` (digits-flow); {} for other models and in-memory pipelines."""
    try:
        path = pipeline_directory(pipe) / "eval" / "prompts.json"
    except ValueError:  # an in-memory pipeline
        return {}
    return json.loads(path.read_text()) if path.is_file() else {}


def model_call(pipe) -> dict:
    """Call arguments a model declares for benchmarks (the tiny video models: clip size and length), from the
    in-memory pipeline's ``fastdiff_bench_call`` or its directory's ``eval/prompts.json`` (``call``); else {}."""
    return dict(getattr(pipe, "fastdiff_bench_call", None) or model_eval_settings(pipe).get("call", {}))


def model_prompts(pipe) -> list[str] | None:
    """The benchmark prompts a model ships in ``eval/prompts.json`` (digits-sd), or None.

    Example::

        model_prompts(StableDiffusionPipeline.from_pretrained("/tmp/digits-sd"))[:2]  # ['a handwritten zero', ...]
    """
    return model_eval_settings(pipe).get("bench_prompts")
