"""Tiny random-weight Flux and Flux.2 pipelines (registered with the other flow models in :mod:`fastdiff.zoo.tiny_flow`)."""

from __future__ import annotations

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    FluxPipeline,
    FluxTransformer2DModel,
)
from transformers import (
    CLIPTextModel,
    Mistral3ForConditionalGeneration,
    Qwen3ForCausalLM,
)

from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.tiny_base import check_size, seeded, text_config
from fastdiff.zoo.tiny_flow_parts import (
    CLIP_WIDTHS,
    FLUX2_BLOCKS,
    FLUX2_SCHEDULER,
    FLUX_BLOCKS,
    FLUX_DEV_SCHEDULER,
    FLUX_SCHNELL_SCHEDULER,
    HEADS,
    ROPE_AXES,
    assemble,
    calmed_transformer,
    kl_vae,
    t5_encoder,
)
from fastdiff.zoo.tokenizer import make_clip_tokenizer


def _flux(size: str, seed: int, guidance: bool) -> FluxPipeline:
    clip_tokenizer = make_clip_tokenizer()
    clip = seeded(seed, CLIPTextModel, text_config(clip_tokenizer, **CLIP_WIDTHS[size]))
    t5_tokenizer, t5 = t5_encoder(size, seed, 512)
    vae = kl_vae(
        size,
        seed,
        16 if size == "bench" else 4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    double, single = FLUX_BLOCKS[size]
    transformer = calmed_transformer(
        seed,
        FluxTransformer2DModel,
        in_channels=4 * vae.config.latent_channels,
        num_layers=double,
        num_single_layers=single,
        joint_attention_dim=t5.config.d_model,
        pooled_projection_dim=clip.config.hidden_size,
        guidance_embeds=guidance,
        axes_dims_rope=ROPE_AXES[size],
        **HEADS[size],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**(FLUX_DEV_SCHEDULER if guidance else FLUX_SCHNELL_SCHEDULER))
    return assemble(
        FluxPipeline, scheduler, vae, clip_tokenizer, clip, transformer, tokenizer_2=t5_tokenizer, text_encoder_2=t5
    )


def make_tiny_flux(size: str = "test", seed: int = 0) -> FluxPipeline:
    """FLUX.1-dev style: guidance-distilled (``guidance_embeds=True``), CLIP pooled + T5 text."""
    check_size("tiny-flux", size)
    return _flux(size, seed, guidance=True)


def make_tiny_flux_schnell(size: str = "test", seed: int = 0) -> FluxPipeline:
    """FLUX.1-schnell style: no guidance input, fixed-shift (1.0) scheduler."""
    check_size("tiny-flux-schnell", size)
    return _flux(size, seed, guidance=False)


def _flux2_transformer(size: str, seed: int, in_channels: int, text_width: int, guidance: bool):
    double, single = FLUX2_BLOCKS[size]
    return calmed_transformer(
        seed,
        Flux2Transformer2DModel,
        in_channels=in_channels,
        num_layers=double,
        num_single_layers=single,
        joint_attention_dim=3 * text_width,
        axes_dims_rope=(ROPE_AXES[size][0],) * 4,
        guidance_embeds=guidance,
        **HEADS[size],
    )


def _flux2_vae(size: str, seed: int) -> AutoencoderKLFlux2:
    return kl_vae(
        size,
        seed,
        8 if size == "bench" else 4,
        cls=AutoencoderKLFlux2,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def make_tiny_flux2(size: str = "test", seed: int = 0) -> Flux2Pipeline:
    """FLUX.2-dev style: Mistral3 text encoder (30 narrow layers; hidden states 10, 20, 30 stacked)."""
    check_size("tiny-flux2", size)
    tokenizer = te.make_mistral_tokenizer()
    width = 16 if size == "test" else 64
    text_encoder = seeded(seed, Mistral3ForConditionalGeneration, te.mistral3_config(tokenizer, width, 30, 2))
    vae = _flux2_vae(size, seed)
    transformer = _flux2_transformer(size, seed, 4 * vae.config.latent_channels, width, guidance=True)
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)
    return assemble(Flux2Pipeline, scheduler, vae, tokenizer, text_encoder, transformer)


def make_tiny_flux2_klein(size: str = "test", seed: int = 0) -> Flux2KleinPipeline:
    """FLUX.2 [klein] base style: Qwen3 text encoder (27 narrow layers), true CFG (not distilled)."""
    check_size("tiny-flux2-klein", size)
    tokenizer = te.make_qwen_tokenizer()
    width = 16 if size == "test" else 64
    text_encoder = seeded(seed, Qwen3ForCausalLM, te.qwen3_config(tokenizer, width, 27, 2))
    vae = _flux2_vae(size, seed)
    transformer = _flux2_transformer(size, seed, 4 * vae.config.latent_channels, width, guidance=False)
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)
    return assemble(Flux2KleinPipeline, scheduler, vae, tokenizer, text_encoder, transformer, is_distilled=False)
