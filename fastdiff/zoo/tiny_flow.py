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
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLQwenImage,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    FluxPipeline,
    FluxTransformer2DModel,
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
    CLIPTextModel,
    CLIPTextModelWithProjection,
    Gemma2Model,
    Mistral3ForConditionalGeneration,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3ForCausalLM,
    Qwen3Model,
    T5EncoderModel,
)

from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.tiny_base import check_size, in_eval_mode, seeded, text_config
from fastdiff.zoo.tokenizer import make_clip_tokenizer

SIZES = ("test", "bench")

# Shared widths: every transformer is 2 heads x 16 (test) or 6 heads x 64 (bench), i.e. 32 or 384 wide.
_HEADS = {"test": dict(num_attention_heads=2, attention_head_dim=16), "bench": dict(num_attention_heads=6, attention_head_dim=64)}  # fmt: skip
_TEXT = {"test": dict(width=32, layers=2, heads=2), "bench": dict(width=128, layers=2, heads=2)}
_CLIP = {"test": dict(hidden=32, layers=2, heads=4), "bench": dict(hidden=128, layers=2, heads=4)}
# Flux-like RoPE axes (sum = head dim) and block counts (double-stream, single-stream).
_AXES = {"test": (4, 4, 8), "bench": (16, 24, 24)}
_FLUX_BLOCKS = {"test": (2, 2), "bench": (2, 4)}
_FLUX2_BLOCKS = {"test": (2, 2), "bench": (2, 6)}
_LAYERS = {  # single-stack transformers
    "sd3": {"test": 2, "bench": 6}, "sana": {"test": 2, "bench": 8}, "pixart": {"test": 2, "bench": 8},
    "qwen": {"test": 2, "bench": 4}, "zimage": {"test": 2, "bench": 6},
}  # fmt: skip
# KL autoencoders: "test" downsamples by 2 (16px latents for 32px images), "bench" by 8.
_KL_BLOCKS = {"test": (16, 32), "bench": (16, 32, 64, 64)}
_SIZE_PX = {"test": 32, "bench": 256}

# The real schedulers' configs (scheduler_config.json of each family's released checkpoint).
FLUX_DEV_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                          max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)  # fmt: skip
FLUX_SCHNELL_SCHEDULER = {**FLUX_DEV_SCHEDULER, "shift": 1.0, "use_dynamic_shifting": False}
FLUX2_SCHEDULER = {**FLUX_DEV_SCHEDULER, "time_shift_type": "exponential"}  # mu from compute_empirical_mu
SD3_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)
QWEN_IMAGE_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5,
                            max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                            time_shift_type="exponential", invert_sigmas=False, stochastic_sampling=False)  # fmt: skip
ZIMAGE_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
_DPM = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", solver_order=2,
            algorithm_type="dpmsolver++", solver_type="midpoint", lower_order_final=True, timestep_spacing="linspace",
            steps_offset=0, final_sigmas_type="zero")  # fmt: skip
SANA_SCHEDULER = {**_DPM, "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0}
PIXART_SIGMA_SCHEDULER = {**_DPM, "prediction_type": "epsilon"}  # PixArt-Sigma is a DDPM (epsilon) model


def _kl_vae(size: str, seed: int, latent_channels: int, cls=AutoencoderKL, **extra):
    blocks = _KL_BLOCKS[size]
    return seeded(
        seed,
        cls,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks),
        block_out_channels=blocks,
        layers_per_block=1,
        norm_num_groups=8,
        latent_channels=latent_channels,
        sample_size=_SIZE_PX[size],
        **extra,
    )


def _calm(*layers: torch.nn.Module, scale: float = 0.1) -> None:
    """Scale output projections down so that random weights give moderate, finite velocities."""
    with torch.no_grad():
        for layer in layers:
            for parameter in layer.parameters():
                parameter.mul_(scale)


def _transformer(seed: int, cls, **config) -> torch.nn.Module:
    """The denoiser ``cls(**config)`` built after ``torch.manual_seed(seed)``, its ``proj_out`` calmed."""
    transformer = seeded(seed, cls, **config)
    _calm(transformer.proj_out)
    return transformer


def _pipeline(cls, scheduler, vae, tokenizer, text_encoder, transformer, **more) -> DiffusionPipeline:
    """``cls`` over these components (``more``: further encoders, pipeline options), in eval mode."""
    return in_eval_mode(cls(scheduler=scheduler, vae=vae, tokenizer=tokenizer, text_encoder=text_encoder,
                             transformer=transformer, **more))  # fmt: skip


def _latent_px(size: str) -> int:
    """Latent side of the KL autoencoders of ``size`` (images of ``_SIZE_PX[size]``)."""
    return _SIZE_PX[size] // 2 ** (len(_KL_BLOCKS[size]) - 1)


def _t5(size: str, seed: int, max_length: int):
    tokenizer = te.make_t5_tokenizer(model_max_length=max_length)
    return tokenizer, seeded(seed, T5EncoderModel, te.t5_config(tokenizer, **_TEXT[size]))


def _flux(size: str, seed: int, guidance: bool) -> FluxPipeline:
    clip_tokenizer = make_clip_tokenizer()
    clip = seeded(seed, CLIPTextModel, text_config(clip_tokenizer, **_CLIP[size]))
    t5_tokenizer, t5 = _t5(size, seed, 512)
    vae = _kl_vae(size, seed, 16 if size == "bench" else 4, use_quant_conv=False, use_post_quant_conv=False,
                  scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    double, single = _FLUX_BLOCKS[size]
    transformer = _transformer(
        seed, FluxTransformer2DModel, in_channels=4 * vae.config.latent_channels, num_layers=double,
        num_single_layers=single, joint_attention_dim=t5.config.d_model, pooled_projection_dim=clip.config.hidden_size,
        guidance_embeds=guidance, axes_dims_rope=_AXES[size], **_HEADS[size],
    )  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(
        **(FLUX_DEV_SCHEDULER if guidance else FLUX_SCHNELL_SCHEDULER)
    )
    return _pipeline(FluxPipeline, scheduler, vae, clip_tokenizer, clip, transformer,
                     tokenizer_2=t5_tokenizer, text_encoder_2=t5)  # fmt: skip


def make_tiny_flux(size: str = "test", seed: int = 0) -> FluxPipeline:
    """FLUX.1-dev style: guidance-distilled (``guidance_embeds=True``), CLIP pooled + T5 text."""
    check_size("tiny-flux", size)
    return _flux(size, seed, guidance=True)


def make_tiny_flux_schnell(size: str = "test", seed: int = 0) -> FluxPipeline:
    """FLUX.1-schnell style: no guidance input, fixed-shift (1.0) scheduler."""
    check_size("tiny-flux-schnell", size)
    return _flux(size, seed, guidance=False)


def _flux2_transformer(size: str, seed: int, in_channels: int, text_width: int, guidance: bool):
    double, single = _FLUX2_BLOCKS[size]
    return _transformer(
        seed, Flux2Transformer2DModel, in_channels=in_channels, num_layers=double, num_single_layers=single,
        joint_attention_dim=3 * text_width, axes_dims_rope=(_AXES[size][0],) * 4, guidance_embeds=guidance,
        **_HEADS[size],
    )  # fmt: skip


def _flux2_vae(size: str, seed: int) -> AutoencoderKLFlux2:
    return _kl_vae(size, seed, 8 if size == "bench" else 4, cls=AutoencoderKLFlux2, use_quant_conv=False,
                   use_post_quant_conv=False)  # fmt: skip


def make_tiny_flux2(size: str = "test", seed: int = 0) -> Flux2Pipeline:
    """FLUX.2-dev style: Mistral3 text encoder (30 narrow layers; hidden states 10, 20, 30 stacked)."""
    check_size("tiny-flux2", size)
    tokenizer = te.make_mistral_tokenizer()
    width = 16 if size == "test" else 64
    text_encoder = seeded(seed, Mistral3ForConditionalGeneration, te.mistral3_config(tokenizer, width, 30, 2))
    vae = _flux2_vae(size, seed)
    transformer = _flux2_transformer(size, seed, 4 * vae.config.latent_channels, width, guidance=True)
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)
    return _pipeline(Flux2Pipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_flux2_klein(size: str = "test", seed: int = 0) -> Flux2KleinPipeline:
    """FLUX.2 [klein] base style: Qwen3 text encoder (27 narrow layers), true CFG (not distilled)."""
    check_size("tiny-flux2-klein", size)
    tokenizer = te.make_qwen_tokenizer()
    width = 16 if size == "test" else 64
    text_encoder = seeded(seed, Qwen3ForCausalLM, te.qwen3_config(tokenizer, width, 27, 2))
    vae = _flux2_vae(size, seed)
    transformer = _flux2_transformer(size, seed, 4 * vae.config.latent_channels, width, guidance=False)
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)
    return _pipeline(
        Flux2KleinPipeline, scheduler, vae, tokenizer, text_encoder, transformer, is_distilled=False
    )


def make_tiny_sd3(size: str = "test", seed: int = 0) -> StableDiffusion3Pipeline:
    """Stable Diffusion 3 style: MMDiT, two projected CLIP encoders + T5 (as wide as both CLIPs)."""
    check_size("tiny-sd3", size)
    tokenizer, tokenizer_2 = make_clip_tokenizer(), make_clip_tokenizer()
    clip = seeded(seed, CLIPTextModelWithProjection, text_config(tokenizer, **_CLIP[size]))
    clip_2 = seeded(seed, CLIPTextModelWithProjection, text_config(tokenizer_2, **_CLIP[size]))
    t5_tokenizer = te.make_t5_tokenizer(model_max_length=256)
    t5_width = 2 * _CLIP[size]["hidden"]  # SD3 pads the concatenated CLIP states to T5's width
    t5 = seeded(seed, T5EncoderModel, te.t5_config(t5_tokenizer, t5_width, _TEXT[size]["layers"], 2))
    vae = _kl_vae(size, seed, 16 if size == "bench" else 4, use_quant_conv=False, use_post_quant_conv=False,
                  scaling_factor=1.5305, shift_factor=0.0609)  # fmt: skip
    inner = _HEADS[size]["num_attention_heads"] * _HEADS[size]["attention_head_dim"]
    latent = _latent_px(size)
    transformer = _transformer(
        seed, SD3Transformer2DModel, sample_size=latent, patch_size=2, in_channels=vae.config.latent_channels,
        out_channels=vae.config.latent_channels, num_layers=_LAYERS["sd3"][size], joint_attention_dim=t5_width,
        caption_projection_dim=inner, pooled_projection_dim=2 * clip.config.projection_dim, pos_embed_max_size=latent,
        **_HEADS[size],
    )  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER)
    return _pipeline(StableDiffusion3Pipeline, scheduler, vae, tokenizer, clip, transformer,
                     tokenizer_2=tokenizer_2, text_encoder_2=clip_2, tokenizer_3=t5_tokenizer,
                     text_encoder_3=t5)  # fmt: skip


def make_tiny_sana(size: str = "test", seed: int = 0) -> SanaPipeline:
    """Sana style: linear-attention DiT, Gemma 2 text encoder, deep-compression autoencoder (DC-AE)."""
    check_size("tiny-sana", size)
    tokenizer = te.make_gemma_tokenizer()
    text_encoder = seeded(seed, Gemma2Model, te.gemma2_config(tokenizer, **_TEXT[size]))
    channels = _KL_BLOCKS[size]
    stages = len(channels)
    kinds = ("ResBlock",) * (stages - 1) + ("EfficientViTBlock",)
    scales = ((),) * (stages - 1) + ((5,),)
    vae = seeded(
        seed, AutoencoderDC, in_channels=3, latent_channels=16 if size == "bench" else 4, attention_head_dim=8,
        encoder_block_types=kinds, decoder_block_types=kinds, encoder_block_out_channels=channels,
        decoder_block_out_channels=channels, encoder_layers_per_block=(1,) * stages,
        decoder_layers_per_block=(1,) * stages, encoder_qkv_multiscales=scales, decoder_qkv_multiscales=scales,
        downsample_block_type="conv", upsample_block_type="interpolate", scaling_factor=0.41407,
    )  # fmt: skip
    heads, head_dim = _HEADS[size]["num_attention_heads"], _HEADS[size]["attention_head_dim"]
    transformer = _transformer(
        seed, SanaTransformer2DModel, in_channels=vae.config.latent_channels, out_channels=vae.config.latent_channels,
        num_layers=_LAYERS["sana"][size], num_cross_attention_heads=heads, cross_attention_head_dim=head_dim,
        cross_attention_dim=heads * head_dim, caption_channels=text_encoder.config.hidden_size,
        sample_size=_latent_px(size), **_HEADS[size],
    )  # fmt: skip
    scheduler = DPMSolverMultistepScheduler(**SANA_SCHEDULER)
    return _pipeline(SanaPipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_pixart_sigma(size: str = "test", seed: int = 0) -> PixArtSigmaPipeline:
    """PixArt-Sigma style: epsilon (and learned variance) DiT with T5 cross-attention, SD-style VAE."""
    check_size("tiny-pixart-sigma", size)
    tokenizer, t5 = _t5(size, seed, 300)
    vae = _kl_vae(size, seed, 4, scaling_factor=0.13025)
    inner = _HEADS[size]["num_attention_heads"] * _HEADS[size]["attention_head_dim"]
    transformer = _transformer(
        seed, PixArtTransformer2DModel, sample_size=_latent_px(size),
        num_layers=_LAYERS["pixart"][size], patch_size=2, in_channels=4, out_channels=8, cross_attention_dim=inner,
        caption_channels=t5.config.d_model, norm_num_groups=8, **_HEADS[size],
    )  # fmt: skip
    scheduler = DPMSolverMultistepScheduler(**PIXART_SIGMA_SCHEDULER)
    return _pipeline(PixArtSigmaPipeline, scheduler, vae, tokenizer, t5, transformer)


def make_tiny_qwen_image(size: str = "test", seed: int = 0) -> QwenImagePipeline:
    """Qwen-Image style: MMDiT over a Qwen2.5-VL text encoder (text only), Qwen-Image (Wan-like) VAE."""
    check_size("tiny-qwen-image", size)
    tokenizer = te.make_qwen_tokenizer(vision=True)
    text_encoder = seeded(
        seed, Qwen2_5_VLForConditionalGeneration, te.qwen2_5_vl_config(tokenizer, **_TEXT[size])
    )
    z_dim = 16 if size == "bench" else 4
    stages = len(_KL_BLOCKS[size]) - 1  # spatial downsampling by 2 per temporal-downsample flag
    vae = seeded(
        seed, AutoencoderKLQwenImage, base_dim=16, z_dim=z_dim, dim_mult=[1, 2, 4, 4][: stages + 1], num_res_blocks=1,
        temperal_downsample=[False, True, True][:stages], latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    )  # fmt: skip
    transformer = _transformer(
        seed, QwenImageTransformer2DModel, patch_size=2, in_channels=4 * z_dim, out_channels=z_dim,
        num_layers=_LAYERS["qwen"][size], joint_attention_dim=text_encoder.config.text_config.hidden_size,
        axes_dims_rope=_AXES[size], **_HEADS[size],
    )  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    return _pipeline(QwenImagePipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_zimage(size: str = "test", seed: int = 0) -> ZImagePipeline:
    """Z-Image style: single-stream DiT with noise and caption refiners over a Qwen3 text encoder."""
    check_size("tiny-zimage", size)
    tokenizer = te.make_qwen_tokenizer()
    text_encoder = seeded(seed, Qwen3Model, te.qwen3_config(tokenizer, **_TEXT[size]))
    vae = _kl_vae(size, seed, 16, scaling_factor=0.3611, shift_factor=0.1159)
    heads, head_dim = _HEADS[size]["num_attention_heads"], _HEADS[size]["attention_head_dim"]
    transformer = seeded(
        seed, ZImageTransformer2DModel, in_channels=16, dim=heads * head_dim, n_layers=_LAYERS["zimage"][size],
        n_refiner_layers=1, n_heads=heads, n_kv_heads=heads, cap_feat_dim=text_encoder.config.hidden_size,
        axes_dims=list(_AXES[size]), axes_lens=[1024, 128, 128],
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.no_grad():  # the pad tokens are created with torch.empty: give them seeded values
        transformer.x_pad_token.normal_(std=0.02)
        transformer.cap_pad_token.normal_(std=0.02)
    _calm(*transformer.all_final_layer.values())
    scheduler = FlowMatchEulerDiscreteScheduler(**ZIMAGE_SCHEDULER)
    return _pipeline(ZImagePipeline, scheduler, vae, tokenizer, text_encoder, transformer)


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
    pipe.default_sample_size = _SIZE_PX[size] // pipe.vae_scale_factor
    return pipe


def _build(name: str, out_dir: Path, size: str = "test", seed: int = 0) -> None:
    FLOW_MAKERS[name](size, seed).save_pretrained(out_dir, safe_serialization=True)


for _name in FLOW_MAKERS:
    register_model(_name, SIZES)(partial(_build, _name))
