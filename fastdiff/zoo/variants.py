"""Pipeline variants of the tiny models: img2img, inpaint, ControlNet, T2I-Adapter, built from shared components.

Each variant is the diffusers pipeline class over the base tiny pipeline's components (``from_pipe``), plus a
ControlNet (``ControlNetModel.from_unet``) or a T2I-Adapter sized to the UNet where the variant needs one.
``variant_inputs`` gives the extra call arguments (init image, mask, control image) for a test-size call.

Example::

    from fastdiff.zoo.variants import make_variant, variant_inputs

    pipe = make_variant("tiny-sd-controlnet", "test")
    images = pipe("a red fox", num_inference_steps=2, output_type="np", **variant_inputs(pipe)).images
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers import (
    ControlNetModel,
    StableDiffusionAdapterPipeline,
    StableDiffusionControlNetImg2ImgPipeline,
    StableDiffusionControlNetInpaintPipeline,
    StableDiffusionControlNetPipeline,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionXLControlNetPipeline,
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    T2IAdapter,
)
from PIL import Image

# variant name -> (base tiny model, pipeline class, extra model: None | "controlnet" | "adapter")
VARIANTS = {
    "tiny-sd-img2img": ("tiny-sd", StableDiffusionImg2ImgPipeline, None),
    "tiny-sd-inpaint": ("tiny-sd", StableDiffusionInpaintPipeline, None),
    "tiny-sd-controlnet": ("tiny-sd", StableDiffusionControlNetPipeline, "controlnet"),
    "tiny-sd-controlnet-img2img": ("tiny-sd", StableDiffusionControlNetImg2ImgPipeline, "controlnet"),
    "tiny-sd-controlnet-inpaint": ("tiny-sd", StableDiffusionControlNetInpaintPipeline, "controlnet"),
    "tiny-sd-adapter": ("tiny-sd", StableDiffusionAdapterPipeline, "adapter"),
    "tiny-sdxl-img2img": ("tiny-sdxl", StableDiffusionXLImg2ImgPipeline, None),
    "tiny-sdxl-inpaint": ("tiny-sdxl", StableDiffusionXLInpaintPipeline, None),
    "tiny-sdxl-controlnet": ("tiny-sdxl", StableDiffusionXLControlNetPipeline, "controlnet"),
}


def _controlnet(unet, seed: int, vae_factor: int) -> ControlNetModel:
    torch.manual_seed(seed + 1)
    # The conditioning embedding downsamples by 2 per extra level: match the VAE so control images are pixels.
    levels = int(np.log2(vae_factor)) + 1
    channels = (16, 32, 96, 256)[:levels]
    return ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=channels).eval()


def _adapter(unet, seed: int, vae_factor: int) -> T2IAdapter:
    torch.manual_seed(seed + 2)
    channels = list(unet.config.block_out_channels)
    return T2IAdapter(in_channels=3, channels=channels, num_res_blocks=1, downscale_factor=vae_factor).eval()


def make_variant(name: str, size: str = "test", seed: int = 0, base=None):
    """Variant ``name`` (a key of ``VARIANTS``) over ``base`` (a tiny pipeline; built if None), sharing its components."""
    from fastdiff.zoo.tiny import make_pipeline

    if name not in VARIANTS:
        raise ValueError(f"unknown pipeline variant {name!r}; available: {', '.join(VARIANTS)}")
    base_name, cls, extra = VARIANTS[name]
    base = base if base is not None else make_pipeline(base_name, size, seed)
    factor = base.vae_scale_factor
    kwargs = {}
    if extra == "controlnet":
        kwargs["controlnet"] = _controlnet(base.unet, seed, factor)
    elif extra == "adapter":
        kwargs["adapter"] = _adapter(base.unet, seed, factor)
    pipe = cls.from_pipe(base, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image(height: int, width: int, seed: int, gray: bool = False) -> Image.Image:
    rng = np.random.default_rng(seed)
    pixels = (rng.random((height, width, 1 if gray else 3)) * 255).astype(np.uint8)
    return Image.fromarray(pixels[..., 0] if gray else pixels)


def variant_inputs(pipe, height: int | None = None, width: int | None = None, batch: int = 1) -> dict:
    """Extra call arguments a variant needs (init image + strength, mask, control image), sized to the call."""
    name = type(pipe).__name__
    size = pipe.unet.config.sample_size * pipe.vae_scale_factor
    h, w = height or size, width or size
    out: dict = {}
    if "Img2Img" in name or "Inpaint" in name:
        out["image"] = [_image(h, w, 1)] * batch if batch > 1 else _image(h, w, 1)
        out["strength"] = 0.75
    if "Inpaint" in name:
        mask = Image.fromarray(
            np.pad(np.full((h // 2, w // 2), 255, np.uint8), ((h // 4,) * 2, (w // 4,) * 2))
        )
        out["mask_image"] = [mask] * batch if batch > 1 else mask
    if "ControlNet" in name:
        key = "control_image" if ("Img2Img" in name or "Inpaint" in name) else "image"
        out[key] = _image(h, w, 2)
    if "Adapter" in name:
        out["image"] = _image(h, w, 3)
    return out
