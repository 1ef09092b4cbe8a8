"""Every tiny model by name (``make_pipeline``), and the zoo builders of the UNet-family tiny pipelines.

The pipelines themselves come from ``fastdiff.zoo.tiny_base`` (SD, SDXL, DiT, DDPM: sizes and parameter counts
there), ``fastdiff.zoo.tiny_flow`` (flow-matching transformers, PixArt-Sigma), ``fastdiff.zoo.tiny_video``
(Wan, CogVideoX, LTX-Video, HunyuanVideo) and ``fastdiff.zoo.variants``
(img2img, inpaint, ControlNet, T2I-Adapter over them); this module sits above them.

Example::

    from fastdiff.zoo.tiny import make_pipeline
    pipe = make_pipeline("tiny-sd", "test", seed=0)
    image = pipe("a photo of a cat", num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
"""

from __future__ import annotations

from pathlib import Path

from diffusers import DiffusionPipeline

from fastdiff.zoo.registry import register_model
from fastdiff.zoo.tiny_base import (  # noqa: F401  (re-exported: the tests and benchmarks import them from here)
    PIPELINE_MAKERS,
    SIZES,
    make_tiny_ddpm,
    make_tiny_dit,
    make_tiny_sd,
    make_tiny_sdxl,
)
from fastdiff.zoo.tiny_flow import FLOW_MAKERS, make_flow_pipeline
from fastdiff.zoo.tiny_video import VIDEO_MAKERS, make_video_pipeline
from fastdiff.zoo.variants import VARIANTS, make_variant


def make_pipeline(name: str, size: str = "test", seed: int = 0) -> DiffusionPipeline:
    """Build zoo model ``name`` in memory without saving it.

    Example::

        pipe = make_pipeline("tiny-ddpm", "test", seed=1)
    """
    if name in VARIANTS:  # img2img, inpaint, ControlNet, T2I-Adapter over a tiny model's components
        return make_variant(name, size, seed)
    if name in FLOW_MAKERS:  # flow-matching transformers (Flux, SD3, Qwen-Image ...) and PixArt-Sigma
        return make_flow_pipeline(name, size, seed)
    if name in VIDEO_MAKERS:  # Wan, CogVideoX, LTX-Video, HunyuanVideo
        return make_video_pipeline(name, size, seed)
    if name not in PIPELINE_MAKERS:
        known = ", ".join([*PIPELINE_MAKERS, *FLOW_MAKERS, *VIDEO_MAKERS, *VARIANTS])
        raise ValueError(f"unknown tiny model {name!r}; available: {known}")
    return PIPELINE_MAKERS[name](size, seed)


@register_model("tiny-sd", SIZES)
def build_tiny_sd(out_dir: Path, size: str = "test", seed: int = 0) -> None:
    make_tiny_sd(size, seed).save_pretrained(out_dir, safe_serialization=True)


@register_model("tiny-sdxl", SIZES)
def build_tiny_sdxl(out_dir: Path, size: str = "test", seed: int = 0) -> None:
    make_tiny_sdxl(size, seed).save_pretrained(out_dir, safe_serialization=True)


@register_model("tiny-dit", SIZES)
def build_tiny_dit(out_dir: Path, size: str = "test", seed: int = 0) -> None:
    make_tiny_dit(size, seed).save_pretrained(out_dir, safe_serialization=True)


@register_model("tiny-ddpm", SIZES)
def build_tiny_ddpm(out_dir: Path, size: str = "test", seed: int = 0) -> None:
    make_tiny_ddpm(size, seed).save_pretrained(out_dir, safe_serialization=True)
