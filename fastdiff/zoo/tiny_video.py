"""Tiny random-weight video diffusion pipelines: Wan 2.1, CogVideoX, LTX-Video and HunyuanVideo.

Built offline like :mod:`fastdiff.zoo.tiny_flow`: ``torch.manual_seed(seed)`` runs before each component, so a
(name, size, seed) triple always gives the same pipeline; tokenizers and text encoders come from
:mod:`fastdiff.zoo.text_encoders` (T5 for Wan, CogVideoX and LTX; a Llama-shaped decoder plus CLIP for
HunyuanVideo). Each family keeps its real scheduler config and its video autoencoder's layout (causal 3D
convolutions, spatial and temporal compression), scaled down: ``test`` makes 9-frame 32px clips, ``bench``
9-frame 128px clips (a denoiser of a few million parameters). Without ``height``/``width``/``num_frames`` the
pipelines use their families' real defaults (480x832, 49-161 frames): pass them, or benchmark through
``fastdiff bench`` / ``make_inputs``, which read the model's benchmark call (``core.inputs.model_call``).

Example::

    from fastdiff.zoo.tiny_video import make_video_pipeline
    pipe = make_video_pipeline("tiny-wan", "test", seed=0)
    out = pipe(prompt="a red fox running", height=32, width=32, num_frames=9, num_inference_steps=2,
               output_type="np")
    out.frames.shape  # (1, 9, 32, 32, 3)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLLTXVideo,
    AutoencoderKLWan,
    CogVideoXDDIMScheduler,
    CogVideoXImageToVideoPipeline,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    DiffusionPipeline,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
    LTXImageToVideoPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPTextModel, LlamaModel, T5EncoderModel, UMT5Config, UMT5EncoderModel

from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.tiny_base import in_eval_mode, seeded, text_config
from fastdiff.zoo.tokenizer import make_clip_tokenizer

SIZES = ("test", "bench")
SIDE = {"test": 32, "bench": 128}
FRAMES = 9  # every family takes 4k+1 (LTX: 8k+1) frames; 9 is the shortest clip with temporal compression
_HEADS = {
    "test": dict(num_attention_heads=2, attention_head_dim=16),
    "bench": dict(num_attention_heads=4, attention_head_dim=32),
}
_LAYERS = {"test": 2, "bench": 4}
_TEXT = {"test": dict(width=32, layers=2, heads=2), "bench": dict(width=64, layers=2, heads=2)}

# The real schedulers' configs (scheduler_config.json of each family's released checkpoint).
WAN_SCHEDULER = dict(
    num_train_timesteps=1000,
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
    solver_order=2,
    solver_type="bh2",
    predict_x0=True,
    lower_order_final=True,
    timestep_spacing="linspace",
    final_sigmas_type="zero",
)  # Wan2.1 480p
COGVIDEOX_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    prediction_type="v_prediction",
    rescale_betas_zero_snr=True,
    set_alpha_to_one=True,
    snr_shift_scale=3.0,
    steps_offset=0,
    timestep_spacing="trailing",
)  # CogVideoX-2b
LTX_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.95,
    max_shift=2.05,
    base_image_seq_len=1024,
    max_image_seq_len=4096,
    shift_terminal=0.1,
    time_shift_type="exponential",
)
HUNYUAN_SCHEDULER = dict(num_train_timesteps=1000, shift=7.0)


def _width(size: str) -> int:
    return _HEADS[size]["num_attention_heads"] * _HEADS[size]["attention_head_dim"]


def _t5(size: str, seed: int, max_length: int, umt5: bool = False):
    tokenizer = te.make_t5_tokenizer(model_max_length=max_length)
    config = te.t5_config(tokenizer, **_TEXT[size])
    if umt5:  # Wan's encoder: T5 with per-layer relative position biases
        return tokenizer, seeded(seed, UMT5EncoderModel, UMT5Config(**config.to_dict()))
    return tokenizer, seeded(seed, T5EncoderModel, config)


def _calm(transformer: torch.nn.Module, *names: str) -> torch.nn.Module:
    """Scale the named output layers down so that random weights give moderate, finite predictions."""
    with torch.no_grad():
        for name in names:
            for parameter in transformer.get_submodule(name).parameters():
                parameter.mul_(0.1)
    return transformer


def _pipeline(cls, scheduler, tokenizer, text_encoder, vae, transformer, **more) -> DiffusionPipeline:
    """``cls`` over these components (``more``: a second text encoder), its transformer's output calmed, in eval
    mode."""
    return in_eval_mode(
        cls(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=scheduler,
            transformer=_calm(transformer, "proj_out"),
            **more,
        )
    )


def make_tiny_wan(size: str = "test", seed: int = 0, image_to_video: bool = False) -> WanPipeline:
    """Wan 2.1 text-to-video style: UMT5-style encoder, Wan causal 3D VAE (8x spatial, 4x temporal), UniPC flow.
    ``image_to_video``: ``WanImageToVideoPipeline`` as Wan 2.2 I2V builds it (no image encoder; the transformer
    also reads the first frame's latents and a 4-channel frame mask)."""
    tokenizer, text_encoder = _t5(size, seed, 512, umt5=True)
    z_dim = 4 if size == "test" else 16
    vae = seeded(
        seed,
        AutoencoderKLWan,
        base_dim=8 if size == "test" else 16,
        z_dim=z_dim,
        dim_mult=[1, 1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    condition = z_dim + vae.config.scale_factor_temporal if image_to_video else 0
    transformer = seeded(
        seed,
        WanTransformer3DModel,
        patch_size=(1, 2, 2),
        in_channels=z_dim + condition,
        out_channels=z_dim,
        text_dim=text_encoder.config.d_model,
        freq_dim=32,
        ffn_dim=2 * _width(size),
        num_layers=_LAYERS[size],
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
        **_HEADS[size],
    )
    cls = WanImageToVideoPipeline if image_to_video else WanPipeline
    return _pipeline(cls, UniPCMultistepScheduler(**WAN_SCHEDULER), tokenizer, text_encoder, vae, transformer)


def make_tiny_cogvideox(size: str = "test", seed: int = 0, image_to_video: bool = False) -> CogVideoXPipeline:
    """CogVideoX-2b style: expert-adaLN DiT over T5 (226 tokens), CogVideoX VAE, v-prediction DDIM (SNR-shifted).
    ``image_to_video``: ``CogVideoXImageToVideoPipeline`` (the transformer also reads the first frame's latents,
    concatenated on the channels, as CogVideoX-5b-I2V does)."""
    tokenizer, text_encoder = _t5(size, seed, 226)
    vae = seeded(  # 8x spatial compression, 4x temporal
        seed,
        AutoencoderKLCogVideoX,
        down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8,) * 4 if size == "test" else (16, 32, 32, 32),
        latent_channels=4 if size == "test" else 16,
        layers_per_block=1,
        norm_num_groups=2 if size == "test" else 8,
        temporal_compression_ratio=4,
    )
    latent = SIDE[size] // 8
    transformer = seeded(
        seed,
        CogVideoXTransformer3DModel,
        in_channels=vae.config.latent_channels * (2 if image_to_video else 1),
        out_channels=vae.config.latent_channels,
        time_embed_dim=_width(size),
        text_embed_dim=text_encoder.config.d_model,
        num_layers=_LAYERS[size],
        sample_width=latent,
        sample_height=latent,
        sample_frames=FRAMES,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=226,
        **_HEADS[size],
    )
    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_SCHEDULER)
    cls = CogVideoXImageToVideoPipeline if image_to_video else CogVideoXPipeline
    return _pipeline(cls, scheduler, tokenizer, text_encoder, vae, transformer)


def make_tiny_ltx(size: str = "test", seed: int = 0, image_to_video: bool = False) -> LTXPipeline:
    """LTX-Video style: one-patch DiT over T5 (128 tokens), LTX VAE (32x spatial, 8x temporal), flow Euler.
    ``image_to_video``: ``LTXImageToVideoPipeline`` over the same model (the first frame's latents fixed,
    per-token timesteps)."""
    tokenizer, text_encoder = _t5(size, seed, 128)
    channels = (8, 8, 8, 8) if size == "test" else (16, 32, 32, 32)
    vae = seeded(
        seed,
        AutoencoderKLLTXVideo,
        latent_channels=8 if size == "test" else 32,
        block_out_channels=channels,
        decoder_block_out_channels=channels,
        layers_per_block=(1,) * 5,
        decoder_layers_per_block=(1,) * 5,
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        patch_size=4,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    transformer = seeded(
        seed,
        LTXVideoTransformer3DModel,
        in_channels=vae.config.latent_channels,
        out_channels=vae.config.latent_channels,
        cross_attention_dim=_width(size),
        num_layers=_LAYERS[size],
        caption_channels=text_encoder.config.d_model,
        **_HEADS[size],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**LTX_SCHEDULER)
    cls = LTXImageToVideoPipeline if image_to_video else LTXPipeline
    return _pipeline(cls, scheduler, tokenizer, text_encoder, vae, transformer)


def make_tiny_hunyuan_video(size: str = "test", seed: int = 0) -> HunyuanVideoPipeline:
    """HunyuanVideo style: dual- then single-stream DiT with embedded guidance over a Llama-shaped decoder and
    CLIP, HunyuanVideo VAE (8x spatial, 4x temporal), flow Euler (shift 7)."""
    tokenizer = te.make_qwen_tokenizer()
    text_encoder = seeded(seed, LlamaModel, te.llama_config(tokenizer, **_TEXT[size]))
    clip_tokenizer = make_clip_tokenizer()
    clip = seeded(seed, CLIPTextModel, text_config(clip_tokenizer, hidden=32, layers=2, heads=4))
    channels = (8,) * 4 if size == "test" else (16, 32, 32, 32)
    vae = seeded(
        seed,
        AutoencoderKLHunyuanVideo,
        latent_channels=4 if size == "test" else 16,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=channels,
        layers_per_block=1,
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    head = _HEADS[size]["attention_head_dim"]
    transformer = seeded(
        seed,
        HunyuanVideoTransformer3DModel,
        in_channels=vae.config.latent_channels,
        out_channels=vae.config.latent_channels,
        num_layers=_LAYERS[size] // 2 + 1,
        num_single_layers=_LAYERS[size],
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=text_encoder.config.hidden_size,
        pooled_projection_dim=clip.config.hidden_size,
        rope_axes_dim=(head // 4, 3 * head // 8, 3 * head // 8),
        **_HEADS[size],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**HUNYUAN_SCHEDULER)
    return _pipeline(
        HunyuanVideoPipeline,
        scheduler,
        tokenizer,
        text_encoder,
        vae,
        transformer,
        tokenizer_2=clip_tokenizer,
        text_encoder_2=clip,
    )


VIDEO_MAKERS: dict[str, Callable[[str, int], DiffusionPipeline]] = {
    "tiny-wan": make_tiny_wan,
    "tiny-cogvideox": make_tiny_cogvideox,
    "tiny-ltx": make_tiny_ltx,
    "tiny-hunyuan-video": make_tiny_hunyuan_video,
    "tiny-wan-i2v": partial(make_tiny_wan, image_to_video=True),
    "tiny-ltx-i2v": partial(make_tiny_ltx, image_to_video=True),
    "tiny-cogvideox-i2v": partial(make_tiny_cogvideox, image_to_video=True),
}


def bench_call(size: str) -> dict:
    """The call a benchmark makes on a tiny video model of ``size``: a 9-frame clip at the size's side."""
    return {"height": SIDE[size], "width": SIDE[size], "num_frames": FRAMES}


def make_video_pipeline(name: str, size: str = "test", seed: int = 0) -> DiffusionPipeline:
    """Build video zoo model ``name`` in memory (eval mode) without saving it.

    Example::

        pipe = make_video_pipeline("tiny-cogvideox", "test", seed=1)
    """
    if name not in VIDEO_MAKERS:
        raise ValueError(f"unknown tiny video model {name!r}; available: {', '.join(VIDEO_MAKERS)}")
    if size not in SIZES:
        raise ValueError(f"{name} has no size {size!r}; allowed: {', '.join(SIZES)}")
    pipe = VIDEO_MAKERS[name](size, seed)
    pipe.fastdiff_bench_call = bench_call(size)  # read by make_inputs; a saved build: eval/prompts.json
    return pipe


def _build(name: str, out_dir: Path, size: str = "test", seed: int = 0) -> None:
    make_video_pipeline(name, size, seed).save_pretrained(out_dir, safe_serialization=True)
    (Path(out_dir) / "eval").mkdir(exist_ok=True)
    (Path(out_dir) / "eval" / "prompts.json").write_text(json.dumps({"call": bench_call(size)}))


for _name in VIDEO_MAKERS:
    register_model(_name, SIZES)(partial(_build, _name))
