"""The published layouts the full-size builds follow: each model's pipeline, native side and denoiser size, and
the config tables of its text towers, UNet, VAE and noise schedule (from the models' own config files)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """One published architecture: its pipeline class, native image side and denoiser size."""

    name: str
    pipeline: str
    side: int
    denoiser_params: int  # as diffusers 0.42 builds it (checked by tests/zoo/test_full_size.py)
    source: str


LAYOUTS = {
    "sd15": Layout("sd15", "StableDiffusionPipeline", 512, 859_520_964, "stable-diffusion-v1-5 configs"),
    "sdxl": Layout("sdxl", "StableDiffusionXLPipeline", 1024, 2_567_463_684, "stable-diffusion-xl-base-1.0"),
    "dit-xl-2": Layout("dit-xl-2", "DiTPipeline", 256, 749_826_464, "facebook/DiT-XL-2-256"),
    "sd35-medium": Layout(
        "sd35-medium", "StableDiffusion3Pipeline", 1024, 2_243_171_520, "stable-diffusion-3.5-medium"
    ),
    "wan-1.3b": Layout(
        "wan-1.3b", "WanPipeline", 480, 1_418_996_800, "Wan2.1-T2V-1.3B-Diffusers (480 x 832, 81 frames)"
    ),
}

# CLIP text towers: OpenAI CLIP ViT-L/14's (SD 1.5, SDXL's first, SD3's clip_l) and OpenCLIP ViT-bigG/14's (SDXL's
# second, SD3's clip_g), as in those repositories' text_encoder*/config.json. The vocabulary keeps CLIP's 49408 rows
# (the generated tokenizer uses the first ~1100), so parameter counts match the published encoders.
CLIP_VOCAB = 49408
CLIP_L = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    hidden_act="quick_gelu",
    projection_dim=768,
)
CLIP_G = dict(
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=20,
    hidden_act="gelu",
    projection_dim=1280,
)

# SD 1.5 unet/config.json (these are also UNet2DConditionModel's defaults, but for cross_attention_dim).
SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    block_out_channels=(320, 640, 1280, 1280),
    layers_per_block=2,
    attention_head_dim=8,
    cross_attention_dim=768,
    norm_num_groups=32,
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
)
# SDXL base unet/config.json: no attention at full resolution, 1/2/10 transformer layers, text_time conditioning
# (6 size/crop ids x 256 + bigG's pooled 1280 = 2816).
SDXL_UNET = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    block_out_channels=(320, 640, 1280),
    layers_per_block=2,
    attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
)
# DiT-XL/2 (Peebles & Xie, table 1: 28 layers, width 1152, 16 heads, patch 2), facebook/DiT-XL-2-256 transformer
# config: learned sigma (8 output channels), adaLN-Zero over 1000 ImageNet classes, 32x32 latents.
DIT_XL_2 = dict(
    num_layers=28,
    num_attention_heads=16,
    attention_head_dim=72,
    in_channels=4,
    out_channels=8,
    patch_size=2,
    sample_size=32,
    num_embeds_ada_norm=1000,
)
# SD 3.5 medium transformer/config.json: MMDiT-X, 24 layers of 24 heads x 64 = 1536 wide, dual attention in
# layers 0-12, RMS q/k norms, 384x384 position table (diffusers' single-file loader tells 3.5 medium from 3 medium
# by that table: pos_embed of 147456 = 384^2 rows, and adaLN rows of 9216 = 6 x 1536).
SD35_MEDIUM = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=24,
    num_attention_heads=24,
    attention_head_dim=64,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    pos_embed_max_size=384,
    qk_norm="rms_norm",
    dual_attention_layers=tuple(range(13)),
)
# The KL autoencoder of SD 1.5 / SDXL / DiT (sd-vae-ft-ema): 128/256/512/512, 2 layers per block, 83.65M; SD3's
# has 16 latent channels and no quant convolutions.
SD_VAE = dict(
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    norm_num_groups=32,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
)
# DDPM betas of SD 1.5 / SDXL training (their scheduler/scheduler_config.json).
SD_BETAS = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
# ImageNet classes 0-9, DiT's labels (the pipeline takes any of the 1000 class ids).
IMAGENET_FIRST = [
    "tench",
    "goldfish",
    "great white shark",
    "tiger shark",
    "hammerhead",
    "electric ray",
    "stingray",
    "cock",
    "hen",
    "ostrich",
]
