"""Tiny random-weight diffusers pipelines (SD, SDXL, DiT, DDPM), built offline from configs, and the helpers
every tiny build shares (``fastdiff.zoo.tiny_flow``, ``fastdiff.zoo.variants`` and ``fastdiff.zoo.tiny`` import them).

Every model has two sizes: ``test`` (a few milliseconds per step, for unit tests) and ``bench`` (a
denoiser of tens of millions of parameters at 256px, for CPU benchmarks). Weights are seeded:
``torch.manual_seed(seed)`` runs before each component is built, so a (name, size, seed) triple always
gives the same pipeline. Parameter counts of the denoisers:

==========  ===================  ===================================
model       test                 bench
==========  ===================  ===================================
tiny-sd     0.79M UNet, 32px     34.97M UNet, 256px
tiny-sdxl   1.36M UNet, 32px     16.67M UNet, 256px
tiny-dit    0.12M DiT, 32px      33.22M DiT (10 x 384), 256px
tiny-ddpm   0.70M UNet, 32px     17.22M UNet, 64px
==========  ===================  ===================================

The latent models share a VAE: 0.17M parameters downsampling by 2 (``test``), 0.98M downsampling by 8
(``bench``; 7.8 GFLOP per 256px decode, against 13.9 GFLOP per guided step of the SD bench UNet).

Example::

    from fastdiff.zoo.tiny_base import make_tiny_sd
    pipe = make_tiny_sd("test", seed=0)
    image = pipe("a photo of a cat", num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
"""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMPipeline,
    DDPMScheduler,
    DiffusionPipeline,
    DiTPipeline,
    DiTTransformer2DModel,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
    UNet2DModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from fastdiff.zoo.tokenizer import make_clip_tokenizer

SIZES = ("test", "bench")

# Autoencoders: "test" downsamples by 2 (32px images from 16px latents), "bench" by 8 like SD's VAE but
# with narrow channels so that the denoiser dominates the cost.
_VAE = {
    "test": dict(block_out_channels=(16, 32), norm_num_groups=8, sample_size=32),
    "bench": dict(block_out_channels=(16, 32, 64, 64), norm_num_groups=8, sample_size=256),
}

# SD 1.5 layout: cross-attention in every down block but the last, mirrored on the way up.
_SD_UNET = {
    "test": dict(
        block_out_channels=(32, 64),
        layers_per_block=1,
        attention_head_dim=(2, 4),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        sample_size=16,
    ),
    "bench": dict(
        block_out_channels=(64, 128, 256, 256),
        layers_per_block=2,
        attention_head_dim=8,  # diffusers' legacy name: 8 heads per block, as in SD 1.5
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        sample_size=32,
    ),
}
_SD_TEXT = {"test": dict(hidden=32, layers=2, heads=4), "bench": dict(hidden=256, layers=4, heads=4)}

# SDXL layout: no attention in the first block, linear projections, text_time added conditioning.
_SDXL_UNET = {
    "test": dict(
        block_out_channels=(32, 64),
        layers_per_block=1,
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        addition_time_embed_dim=8,
        sample_size=16,
    ),
    "bench": dict(
        block_out_channels=(64, 128, 192),
        layers_per_block=2,
        attention_head_dim=(2, 4, 6),
        transformer_layers_per_block=(1, 1, 1),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        addition_time_embed_dim=32,
        sample_size=32,
    ),
}
_SDXL_TEXT = {"test": dict(hidden=32, layers=2, heads=4), "bench": dict(hidden=128, layers=3, heads=4)}

# DiT: 1000 classes because DiTPipeline hard-codes class 1000 as the null (unconditional) label.
_DIT = {
    "test": dict(num_layers=2, num_attention_heads=2, attention_head_dim=16, sample_size=16),
    "bench": dict(num_layers=10, num_attention_heads=6, attention_head_dim=64, sample_size=32),
}
_DIT_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

_DDPM_UNET = {
    "test": dict(
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        sample_size=32,
    ),
    "bench": dict(
        block_out_channels=(64, 128, 128, 256),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        sample_size=64,
    ),
}


def check_size(model: str, size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"{model} has no size {size!r}; allowed: {', '.join(SIZES)}")


def seeded(seed: int, build, *args, **kwargs):
    """Build one component right after ``torch.manual_seed(seed)`` so its weights depend only on seed."""
    torch.manual_seed(seed)
    return build(*args, **kwargs)


def in_eval_mode(pipe: DiffusionPipeline) -> DiffusionPipeline:
    """Put every model in eval mode, as ``from_pretrained`` does, so in-memory and reloaded outputs match."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def text_config(tokenizer: CLIPTokenizer, hidden: int, layers: int, heads: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=tokenizer.model_max_length,
        projection_dim=hidden,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # CLIP pools the text at the first eos token
        pad_token_id=tokenizer.pad_token_id,
    )


def _vae(size: str, seed: int) -> AutoencoderKL:
    config = _VAE[size]
    blocks = len(config["block_out_channels"])
    return seeded(
        seed,
        AutoencoderKL,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=1,
        latent_channels=4,
        **config,
    )


def sd_scheduler() -> DDIMScheduler:
    """DDIM with SD 1.5 / SDXL training betas."""
    return DDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        timestep_spacing="leading",
    )


def make_tiny_sd(size: str = "test", seed: int = 0) -> StableDiffusionPipeline:
    """Random-weight Stable Diffusion 1.5-style pipeline (no safety checker).

    ``bench``: 34.97M-parameter UNet (64/128/256/256 channels, 2 layers per block, 8 heads), 256px
    default images from 32x32 latents, 4-layer 256-wide text encoder (3.5M), 0.98M-parameter VAE.

    Example::

        pipe = make_tiny_sd("test")
        images = pipe("a cat", num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
    """
    check_size("tiny-sd", size)
    tokenizer = make_clip_tokenizer()
    text = _SD_TEXT[size]
    text_encoder = seeded(seed, CLIPTextModel, text_config(tokenizer, **text))
    unet = seeded(
        seed,
        UNet2DConditionModel,
        in_channels=4,
        out_channels=4,
        cross_attention_dim=text["hidden"],
        **_SD_UNET[size],
    )
    pipe = StableDiffusionPipeline(
        vae=_vae(size, seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=sd_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return in_eval_mode(pipe)


def make_tiny_sdxl(size: str = "test", seed: int = 0) -> StableDiffusionXLPipeline:
    """Random-weight SDXL-style pipeline: two CLIP text encoders and a ``text_time`` conditioned UNet.

    ``bench``: 16.67M-parameter UNet (64/128/192 channels), 256px default images, two 128-wide
    text encoders (cross-attention width 256, pooled projection 128).

    Example::

        pipe = make_tiny_sdxl("test")
        images = pipe("a cat", num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
    """
    check_size("tiny-sdxl", size)
    tokenizer, tokenizer_2 = make_clip_tokenizer(), make_clip_tokenizer()
    text = _SDXL_TEXT[size]
    text_encoder = seeded(seed, CLIPTextModel, text_config(tokenizer, **text))
    text_encoder_2 = seeded(seed, CLIPTextModelWithProjection, text_config(tokenizer_2, **text))
    unet_config = dict(_SDXL_UNET[size])
    # Added conditioning = 6 size/crop time ids embedded at addition_time_embed_dim + the pooled text.
    time_ids_width = 6 * unet_config["addition_time_embed_dim"]
    unet = seeded(
        seed,
        UNet2DConditionModel,
        in_channels=4,
        out_channels=4,
        use_linear_projection=True,
        addition_embed_type="text_time",
        cross_attention_dim=text_encoder.config.hidden_size + text_encoder_2.config.hidden_size,
        projection_class_embeddings_input_dim=time_ids_width + text_encoder_2.config.projection_dim,
        **unet_config,
    )
    pipe = StableDiffusionXLPipeline(
        vae=_vae(size, seed),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=sd_scheduler(),
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )
    return in_eval_mode(pipe)


def make_tiny_dit(size: str = "test", seed: int = 0) -> DiTPipeline:
    """Random-weight class-conditional DiT pipeline (1000 classes; 10 named: 0 airplane .. 9 truck).

    ``bench``: 33.22M-parameter transformer (10 blocks, 6 heads x 64 = 384 wide, patch 2) over 32x32
    latents, 256px images. The transformer predicts noise and variance (8 output channels) like DiT.

    Example::

        pipe = make_tiny_dit("test")
        images = pipe(class_labels=[3], num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
    """
    check_size("tiny-dit", size)
    transformer = seeded(
        seed,
        DiTTransformer2DModel,
        in_channels=4,
        out_channels=8,
        patch_size=2,
        num_embeds_ada_norm=1000,
        **_DIT[size],
    )
    scheduler = DDIMScheduler(
        num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001, beta_end=0.02, clip_sample=False
    )
    id2label = {index: label for index, label in enumerate(_DIT_LABELS)}
    pipe = DiTPipeline(transformer=transformer, vae=_vae(size, seed), scheduler=scheduler, id2label=id2label)
    pipe.register_to_config(id2label=id2label)  # DiTPipeline does not store it; this saves it to model_index
    return in_eval_mode(pipe)


def make_tiny_ddpm(size: str = "test", seed: int = 0) -> DDPMPipeline:
    """Random-weight pixel-space DDPM pipeline (UNet2DModel + DDPMScheduler, linear betas).

    ``test``: 32px images; ``bench``: 64px images from a 17.22M-parameter UNet.

    Example::

        pipe = make_tiny_ddpm("test")
        images = pipe(num_inference_steps=2, output_type="np").images  # (1, 32, 32, 3)
    """
    check_size("tiny-ddpm", size)
    unet = seeded(seed, UNet2DModel, in_channels=3, out_channels=3, **_DDPM_UNET[size])
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=True)
    return in_eval_mode(DDPMPipeline(unet=unet, scheduler=scheduler))


PIPELINE_MAKERS = {
    "tiny-sd": make_tiny_sd,
    "tiny-sdxl": make_tiny_sdxl,
    "tiny-dit": make_tiny_dit,
    "tiny-ddpm": make_tiny_ddpm,
}
