"""Tiny random-weight flow-matching transformer pipelines (Flux, Flux.2, SD3, Sana, PixArt-Sigma, Qwen-Image, Z-Image).

Built offline like :mod:`fastdiff.zoo.tiny`: ``torch.manual_seed(seed)`` runs before each component, so a
(name, size, seed) triple always gives the same pipeline; tokenizers and text encoders come from
:mod:`fastdiff.zoo.text_encoders`. ``test`` models make 32px images in milliseconds per step; ``bench``
models have a denoiser of 10-40M parameters at 256px. Each family saves its real scheduler config.
Parameter counts of the denoisers:

=================  ========================  =============================  ===============
model              test (32px)               bench (256px)                  bench, 20 steps
=================  ========================  =============================  ===============
tiny-flux          0.13M, 2+2 blocks x 32    20.59M, 2+4 blocks x 384       9.6 s
tiny-flux-schnell  0.12M, 2+2 blocks x 32    20.34M, 2+4 blocks x 384       9.0 s
tiny-flux2         0.12M, 2+2 blocks x 32    22.27M, 2+6 blocks x 384       8.7 s
tiny-flux2-klein   0.11M, 2+2 blocks x 32    22.02M, 2+6 blocks x 384       18.8 s (CFG)
tiny-sd3           0.08M, 2 blocks x 32      30.94M, 6 blocks x 384         9.0 s (CFG)
tiny-sana          0.05M, 2 blocks x 32      19.83M, 8 blocks x 384         16.4 s (CFG)
tiny-pixart-sigma  0.05M, 2 blocks x 32      20.28M, 8 blocks x 384         4.5 s (CFG)
tiny-qwen-image    0.09M, 2 blocks x 32      21.92M, 4 blocks x 384         3.1 s (CFG)
tiny-zimage        0.37M, 2+1+1 blocks x 32  17.66M, 6+1+1 blocks x 384     3.3 s (CFG)
=================  ========================  =============================  ===============

Timings: one CPU thread, default guidance, measured once on a shared machine (2-step ``test`` calls
take 0.06-0.3 s, text encoding included). Text encoders are narrow (32 wide in ``test``, 128 in
``bench``) so that the denoiser dominates.

Sana and PixArt-Sigma bin resolutions by default (their ``use_resolution_binning=True`` maps any size to
the transformer's native bin, e.g. 1024px for Sana's ``sample_size=32``): pass
``use_resolution_binning=False`` to get the requested size. Flux.2 and Klein read the text encoder's hidden
states (10, 20, 30) and (9, 18, 27) by default, so their (narrow) text encoders are 30 and 27 layers deep.

Example::

    from fastdiff.zoo.tiny_flow import make_flow_pipeline
    pipe = make_flow_pipeline("tiny-flux", "test", seed=0)
    out = pipe(prompt="a photo of a cat", height=32, width=32, num_inference_steps=2, output_type="np")
    out.images.shape  # (1, 32, 32, 3); without height/width the pipelines default to 128 latent patches
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from diffusers import (
    AutoencoderDC,
    AutoencoderKLQwenImage,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SanaPipeline,
    SanaTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from transformers import (
    CLIPTextModelWithProjection,
    Gemma2Model,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3Model,
    T5EncoderModel,
)

from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.tiny_base import check_size, seeded, text_config
from fastdiff.zoo.tiny_flow_parts import (
    CLIP_WIDTHS,
    HEADS,
    KL_BLOCKS,
    LAYERS,
    PIXART_SIGMA_SCHEDULER,
    QWEN_IMAGE_SCHEDULER,
    ROPE_AXES,
    SANA_SCHEDULER,
    SD3_SCHEDULER,
    SIZE_PX,
    SIZES,
    TEXT_WIDTHS,
    ZIMAGE_SCHEDULER,
    assemble,
    calm,
    calmed_transformer,
    kl_vae,
    latent_px,
    t5_encoder,
)
from fastdiff.zoo.tiny_flux import make_tiny_flux, make_tiny_flux2, make_tiny_flux2_klein, make_tiny_flux_schnell
from fastdiff.zoo.tokenizer import make_clip_tokenizer


def make_tiny_sd3(size: str = "test", seed: int = 0) -> StableDiffusion3Pipeline:
    """Stable Diffusion 3 style: MMDiT, two projected CLIP encoders + T5 (as wide as both CLIPs)."""
    check_size("tiny-sd3", size)
    tokenizer, tokenizer_2 = make_clip_tokenizer(), make_clip_tokenizer()
    clip = seeded(seed, CLIPTextModelWithProjection, text_config(tokenizer, **CLIP_WIDTHS[size]))
    clip_2 = seeded(seed, CLIPTextModelWithProjection, text_config(tokenizer_2, **CLIP_WIDTHS[size]))
    t5_tokenizer = te.make_t5_tokenizer(model_max_length=256)
    t5_width = 2 * CLIP_WIDTHS[size]["hidden"]  # SD3 pads the concatenated CLIP states to T5's width
    t5 = seeded(seed, T5EncoderModel, te.t5_config(t5_tokenizer, t5_width, TEXT_WIDTHS[size]["layers"], 2))
    vae = kl_vae(
        size,
        seed,
        16 if size == "bench" else 4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=1.5305,
        shift_factor=0.0609,
    )
    inner = HEADS[size]["num_attention_heads"] * HEADS[size]["attention_head_dim"]
    latent = latent_px(size)
    transformer = calmed_transformer(
        seed,
        SD3Transformer2DModel,
        sample_size=latent,
        patch_size=2,
        in_channels=vae.config.latent_channels,
        out_channels=vae.config.latent_channels,
        num_layers=LAYERS["sd3"][size],
        joint_attention_dim=t5_width,
        caption_projection_dim=inner,
        pooled_projection_dim=2 * clip.config.projection_dim,
        pos_embed_max_size=latent,
        **HEADS[size],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER)
    return assemble(
        StableDiffusion3Pipeline,
        scheduler,
        vae,
        tokenizer,
        clip,
        transformer,
        tokenizer_2=tokenizer_2,
        text_encoder_2=clip_2,
        tokenizer_3=t5_tokenizer,
        text_encoder_3=t5,
    )


def make_tiny_sana(size: str = "test", seed: int = 0) -> SanaPipeline:
    """Sana style: linear-attention DiT, Gemma 2 text encoder, deep-compression autoencoder (DC-AE)."""
    check_size("tiny-sana", size)
    tokenizer = te.make_gemma_tokenizer()
    text_encoder = seeded(seed, Gemma2Model, te.gemma2_config(tokenizer, **TEXT_WIDTHS[size]))
    channels = KL_BLOCKS[size]
    stages = len(channels)
    kinds = ("ResBlock",) * (stages - 1) + ("EfficientViTBlock",)
    scales = ((),) * (stages - 1) + ((5,),)
    vae = seeded(
        seed,
        AutoencoderDC,
        in_channels=3,
        latent_channels=16 if size == "bench" else 4,
        attention_head_dim=8,
        encoder_block_types=kinds,
        decoder_block_types=kinds,
        encoder_block_out_channels=channels,
        decoder_block_out_channels=channels,
        encoder_layers_per_block=(1,) * stages,
        decoder_layers_per_block=(1,) * stages,
        encoder_qkv_multiscales=scales,
        decoder_qkv_multiscales=scales,
        downsample_block_type="conv",
        upsample_block_type="interpolate",
        scaling_factor=0.41407,
    )
    heads, head_dim = HEADS[size]["num_attention_heads"], HEADS[size]["attention_head_dim"]
    transformer = calmed_transformer(
        seed,
        SanaTransformer2DModel,
        in_channels=vae.config.latent_channels,
        out_channels=vae.config.latent_channels,
        num_layers=LAYERS["sana"][size],
        num_cross_attention_heads=heads,
        cross_attention_head_dim=head_dim,
        cross_attention_dim=heads * head_dim,
        caption_channels=text_encoder.config.hidden_size,
        sample_size=latent_px(size),
        **HEADS[size],
    )
    scheduler = DPMSolverMultistepScheduler(**SANA_SCHEDULER)
    return assemble(SanaPipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_pixart_sigma(size: str = "test", seed: int = 0) -> PixArtSigmaPipeline:
    """PixArt-Sigma style: epsilon (and learned variance) DiT with T5 cross-attention, SD-style VAE."""
    check_size("tiny-pixart-sigma", size)
    tokenizer, t5 = t5_encoder(size, seed, 300)
    vae = kl_vae(size, seed, 4, scaling_factor=0.13025)
    inner = HEADS[size]["num_attention_heads"] * HEADS[size]["attention_head_dim"]
    transformer = calmed_transformer(
        seed,
        PixArtTransformer2DModel,
        sample_size=latent_px(size),
        num_layers=LAYERS["pixart"][size],
        patch_size=2,
        in_channels=4,
        out_channels=8,
        cross_attention_dim=inner,
        caption_channels=t5.config.d_model,
        norm_num_groups=8,
        **HEADS[size],
    )
    scheduler = DPMSolverMultistepScheduler(**PIXART_SIGMA_SCHEDULER)
    return assemble(PixArtSigmaPipeline, scheduler, vae, tokenizer, t5, transformer)


def make_tiny_qwen_image(size: str = "test", seed: int = 0) -> QwenImagePipeline:
    """Qwen-Image style: MMDiT over a Qwen2.5-VL text encoder (text only), Qwen-Image (Wan-like) VAE."""
    check_size("tiny-qwen-image", size)
    tokenizer = te.make_qwen_tokenizer(vision=True)
    text_encoder = seeded(
        seed, Qwen2_5_VLForConditionalGeneration, te.qwen2_5_vl_config(tokenizer, **TEXT_WIDTHS[size])
    )
    z_dim = 16 if size == "bench" else 4
    stages = len(KL_BLOCKS[size]) - 1  # spatial downsampling by 2 per temporal-downsample flag
    vae = seeded(
        seed,
        AutoencoderKLQwenImage,
        base_dim=16,
        z_dim=z_dim,
        dim_mult=[1, 2, 4, 4][: stages + 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True][:stages],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    transformer = calmed_transformer(
        seed,
        QwenImageTransformer2DModel,
        patch_size=2,
        in_channels=4 * z_dim,
        out_channels=z_dim,
        num_layers=LAYERS["qwen"][size],
        joint_attention_dim=text_encoder.config.text_config.hidden_size,
        axes_dims_rope=ROPE_AXES[size],
        **HEADS[size],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    return assemble(QwenImagePipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_zimage(size: str = "test", seed: int = 0) -> ZImagePipeline:
    """Z-Image style: single-stream DiT with noise and caption refiners over a Qwen3 text encoder."""
    check_size("tiny-zimage", size)
    tokenizer = te.make_qwen_tokenizer()
    text_encoder = seeded(seed, Qwen3Model, te.qwen3_config(tokenizer, **TEXT_WIDTHS[size]))
    vae = kl_vae(size, seed, 16, scaling_factor=0.3611, shift_factor=0.1159)
    heads, head_dim = HEADS[size]["num_attention_heads"], HEADS[size]["attention_head_dim"]
    transformer = seeded(
        seed,
        ZImageTransformer2DModel,
        in_channels=16,
        dim=heads * head_dim,
        n_layers=LAYERS["zimage"][size],
        n_refiner_layers=1,
        n_heads=heads,
        n_kv_heads=heads,
        cap_feat_dim=text_encoder.config.hidden_size,
        axes_dims=list(ROPE_AXES[size]),
        axes_lens=[1024, 128, 128],
    )
    torch.manual_seed(seed)
    with torch.no_grad():  # the pad tokens are created with torch.empty: give them seeded values
        transformer.x_pad_token.normal_(std=0.02)
        transformer.cap_pad_token.normal_(std=0.02)
    calm(*transformer.all_final_layer.values())
    scheduler = FlowMatchEulerDiscreteScheduler(**ZIMAGE_SCHEDULER)
    return assemble(ZImagePipeline, scheduler, vae, tokenizer, text_encoder, transformer)


FLOW_MAKERS: dict[str, Callable[[str, int], DiffusionPipeline]] = {
    "tiny-flux": make_tiny_flux,
    "tiny-flux-schnell": make_tiny_flux_schnell,
    "tiny-flux2": make_tiny_flux2,
    "tiny-flux2-klein": make_tiny_flux2_klein,
    "tiny-sd3": make_tiny_sd3,
    "tiny-sana": make_tiny_sana,
    "tiny-pixart-sigma": make_tiny_pixart_sigma,
    "tiny-qwen-image": make_tiny_qwen_image,
    "tiny-zimage": make_tiny_zimage,
}


def make_flow_pipeline(name: str, size: str = "test", seed: int = 0) -> DiffusionPipeline:
    """Build flow zoo model ``name`` in memory (eval mode) without saving it.

    Example::

        pipe = make_flow_pipeline("tiny-sd3", "test", seed=1)
    """
    if name not in FLOW_MAKERS:
        raise ValueError(f"unknown tiny flow model {name!r}; available: {', '.join(FLOW_MAKERS)}")
    pipe = FLOW_MAKERS[name](size, seed)
    # the size these pipelines generate when called without height/width (diffusers' attribute; a reloaded
    # directory gets the family's real default, so pass height/width there)
    pipe.default_sample_size = SIZE_PX[size] // pipe.vae_scale_factor
    return pipe


def _build(name: str, out_dir: Path, size: str = "test", seed: int = 0) -> None:
    FLOW_MAKERS[name](size, seed).save_pretrained(out_dir, safe_serialization=True)


for _name in FLOW_MAKERS:
    register_model(_name, SIZES)(partial(_build, _name))
