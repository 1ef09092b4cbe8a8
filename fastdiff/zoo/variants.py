"""Pipeline variants of the tiny models: img2img, inpaint, ControlNet, T2I-Adapter, built from shared components.

Each variant is the diffusers pipeline class over the base tiny pipeline's components (``from_pipe``), plus a
ControlNet (``ControlNetModel.from_unet``) or a T2I-Adapter sized to the UNet where the variant needs one.
``fastdiff.core.inputs.make_inputs`` gives a call's arguments, synthetic images included (the pipeline facts
say which arguments take images).

Example::

    from fastdiff.core.inputs import make_inputs
    from fastdiff.zoo.variants import make_variant

    pipe = make_variant("tiny-sd-controlnet", "test")
    images = pipe(**make_inputs(pipe, 1), num_inference_steps=2, output_type="np").images
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers import (
    ControlNetModel,
    FluxControlNetModel,
    FluxControlNetPipeline,
    FluxImg2ImgPipeline,
    FluxInpaintPipeline,
    QwenImageImg2ImgPipeline,
    QwenImageInpaintPipeline,
    SD3ControlNetModel,
    StableDiffusion3ControlNetPipeline,
    StableDiffusion3Img2ImgPipeline,
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

from fastdiff.core.siblings import sibling
from fastdiff.zoo.tiny_base import PIPELINE_MAKERS
from fastdiff.zoo.tiny_flow import make_flow_pipeline

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
    # (no tiny-sd3-inpaint: StableDiffusion3InpaintPipeline insists on SD3's 16 latent channels; tiny-sd3 has 4)
    "tiny-flux-img2img": ("tiny-flux", FluxImg2ImgPipeline, None),
    "tiny-flux-inpaint": ("tiny-flux", FluxInpaintPipeline, None),
    "tiny-flux-controlnet": ("tiny-flux", FluxControlNetPipeline, "controlnet"),
    "tiny-sd3-img2img": ("tiny-sd3", StableDiffusion3Img2ImgPipeline, None),
    "tiny-sd3-controlnet": ("tiny-sd3", StableDiffusion3ControlNetPipeline, "controlnet"),
    "tiny-qwen-image-img2img": ("tiny-qwen-image", QwenImageImg2ImgPipeline, None),
    "tiny-qwen-image-inpaint": ("tiny-qwen-image", QwenImageInpaintPipeline, None),
}


def _controlnet(unet, seed: int, vae_factor: int) -> ControlNetModel:
    torch.manual_seed(seed + 1)
    # The conditioning embedding downsamples by 2 per extra level: match the VAE so control images are pixels.
    levels = int(np.log2(vae_factor)) + 1
    channels = (16, 32, 96, 256)[:levels]
    return ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=channels).eval()


def _transformer_controlnet(transformer, seed: int):
    """A ControlNet of one block copied from a Flux or SD3 transformer (diffusers' ``from_transformer``)."""
    torch.manual_seed(seed + 1)
    config = transformer.config
    if type(transformer).__name__.startswith("Flux"):
        return FluxControlNetModel.from_transformer(
            transformer,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=config.attention_head_dim,
            num_attention_heads=config.num_attention_heads,
        ).eval()
    return SD3ControlNetModel.from_transformer(transformer, num_layers=1, num_extra_conditioning_channels=0).eval()


def _adapter(unet, seed: int, vae_factor: int) -> T2IAdapter:
    torch.manual_seed(seed + 2)
    channels = list(unet.config.block_out_channels)
    return T2IAdapter(in_channels=3, channels=channels, num_res_blocks=1, downscale_factor=vae_factor).eval()


def make_variant(name: str, size: str = "test", seed: int = 0, base=None):
    """Variant ``name`` (a key of ``VARIANTS``) over ``base`` (a tiny pipeline; built if None), sharing its components."""
    if name not in VARIANTS:
        raise ValueError(f"unknown pipeline variant {name!r}; available: {', '.join(VARIANTS)}")
    base_name, cls, extra = VARIANTS[name]
    if base is None:
        base = (
            PIPELINE_MAKERS[base_name](size, seed)
            if base_name in PIPELINE_MAKERS
            else make_flow_pipeline(base_name, size, seed)
        )
    factor = base.vae_scale_factor
    kwargs = {}
    if extra == "controlnet" and hasattr(base, "transformer"):
        kwargs["controlnet"] = _transformer_controlnet(base.transformer, seed)
    elif extra == "controlnet":
        kwargs["controlnet"] = _controlnet(base.unet, seed, factor)
    elif extra == "adapter":
        kwargs["adapter"] = _adapter(base.unet, seed, factor)
    pipe = sibling(base, cls, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe
