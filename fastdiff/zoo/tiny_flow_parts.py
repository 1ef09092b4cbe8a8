"""The shared parts of the tiny flow-matching builders (:mod:`fastdiff.zoo.tiny_flow`, :mod:`fastdiff.zoo.tiny_flux`):
widths and block counts per size, the families' scheduler configs, and the helpers that build an autoencoder, a
T5 encoder, a calmed transformer and a pipeline from them."""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    DiffusionPipeline,
)
from transformers import (
    T5EncoderModel,
)

from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.tiny_base import in_eval_mode, seeded

SIZES = ("test", "bench")

# Shared widths: every transformer is 2 heads x 16 (test) or 6 heads x 64 (bench), i.e. 32 or 384 wide.
HEADS = {
    "test": dict(num_attention_heads=2, attention_head_dim=16),
    "bench": dict(num_attention_heads=6, attention_head_dim=64),
}
TEXT_WIDTHS = {"test": dict(width=32, layers=2, heads=2), "bench": dict(width=128, layers=2, heads=2)}
CLIP_WIDTHS = {"test": dict(hidden=32, layers=2, heads=4), "bench": dict(hidden=128, layers=2, heads=4)}
# Flux-like RoPE axes (sum = head dim) and block counts (double-stream, single-stream).
ROPE_AXES = {"test": (4, 4, 8), "bench": (16, 24, 24)}
FLUX_BLOCKS = {"test": (2, 2), "bench": (2, 4)}
FLUX2_BLOCKS = {"test": (2, 2), "bench": (2, 6)}
LAYERS = {  # single-stack transformers
    "sd3": {"test": 2, "bench": 6},
    "sana": {"test": 2, "bench": 8},
    "pixart": {"test": 2, "bench": 8},
    "qwen": {"test": 2, "bench": 4},
    "zimage": {"test": 2, "bench": 6},
}
# KL autoencoders: "test" downsamples by 2 (16px latents for 32px images), "bench" by 8.
KL_BLOCKS = {"test": (16, 32), "bench": (16, 32, 64, 64)}
SIZE_PX = {"test": 32, "bench": 256}

# The real schedulers' configs (scheduler_config.json of each family's released checkpoint).
FLUX_DEV_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)
FLUX_SCHNELL_SCHEDULER = {**FLUX_DEV_SCHEDULER, "shift": 1.0, "use_dynamic_shifting": False}
FLUX2_SCHEDULER = {**FLUX_DEV_SCHEDULER, "time_shift_type": "exponential"}  # mu from compute_empirical_mu
SD3_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)
QWEN_IMAGE_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=0.9,
    base_image_seq_len=256,
    max_image_seq_len=8192,
    shift_terminal=0.02,
    time_shift_type="exponential",
    invert_sigmas=False,
    stochastic_sampling=False,
)
ZIMAGE_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
DPM_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    solver_order=2,
    algorithm_type="dpmsolver++",
    solver_type="midpoint",
    lower_order_final=True,
    timestep_spacing="linspace",
    steps_offset=0,
    final_sigmas_type="zero",
)
SANA_SCHEDULER = {**DPM_SCHEDULER, "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0}
PIXART_SIGMA_SCHEDULER = {**DPM_SCHEDULER, "prediction_type": "epsilon"}  # PixArt-Sigma is a DDPM (epsilon) model


def kl_vae(size: str, seed: int, latent_channels: int, cls=AutoencoderKL, **extra):
    blocks = KL_BLOCKS[size]
    return seeded(
        seed,
        cls,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks),
        block_out_channels=blocks,
        layers_per_block=1,
        norm_num_groups=8,
        latent_channels=latent_channels,
        sample_size=SIZE_PX[size],
        **extra,
    )


def calm(*layers: torch.nn.Module, scale: float = 0.1) -> None:
    """Scale output projections down so that random weights give moderate, finite velocities."""
    with torch.no_grad():
        for layer in layers:
            for parameter in layer.parameters():
                parameter.mul_(scale)


def calmed_transformer(seed: int, cls, **config) -> torch.nn.Module:
    """The denoiser ``cls(**config)`` built after ``torch.manual_seed(seed)``, its ``proj_out`` calmed."""
    transformer = seeded(seed, cls, **config)
    calm(transformer.proj_out)
    return transformer


def assemble(cls, scheduler, vae, tokenizer, text_encoder, transformer, **more) -> DiffusionPipeline:
    """``cls`` over these components (``more``: further encoders, pipeline options), in eval mode."""
    return in_eval_mode(
        cls(
            scheduler=scheduler,
            vae=vae,
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            transformer=transformer,
            **more,
        )
    )


def latent_px(size: str) -> int:
    """Latent side of the KL autoencoders of ``size`` (images of ``SIZE_PX[size]``)."""
    return SIZE_PX[size] // 2 ** (len(KL_BLOCKS[size]) - 1)


def t5_encoder(size: str, seed: int, max_length: int):
    tokenizer = te.make_t5_tokenizer(model_max_length=max_length)
    return tokenizer, seeded(seed, T5EncoderModel, te.t5_config(tokenizer, **TEXT_WIDTHS[size]))
