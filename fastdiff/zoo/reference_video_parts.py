"""The moving-digits model itself: its constants, VAE, transformer, text parts, scheduler and the cross-attention
processor that counts padded context tokens (:mod:`fastdiff.zoo.reference_video` trains, builds and scores it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel

from fastdiff.zoo import moving_digits as md
from fastdiff.zoo import text_encoders as te
from fastdiff.zoo.tiny_base import seeded
from fastdiff.zoo.tiny_video import WAN_SCHEDULER

CONTEXT = 512  # WanPipeline's max_sequence_length: every prompt is padded to this many tokens
Z_DIM, VAE_FRAMES = 8, 5  # the VAE trains on 5-frame windows (one first frame, one chunk of 4)
FLOW_SHIFT = 1.0  # no shift at 5x8x8 latents (Wan 2.1 uses 3.0 at 480p)
DEFAULT_STEPS = 50  # WanPipeline's own default, with its UniPC sampler
# WanPipeline's default guidance is 5.0 (tuned for Wan 2.1); this model's FD is lowest at 1.5 of 5, 4, 3, 2, 1.5, 1
DEFAULT_GUIDANCE = 1.5
PROMPT_DROPOUT = 0.1
SIZES = {"test": dict(vae_steps=4, steps=4, images=40), "bench": dict(vae_steps=1200, steps=10000)}


def make_vae() -> AutoencoderKLWan:
    return AutoencoderKLWan(
        base_dim=16,
        z_dim=Z_DIM,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * Z_DIM,
        latents_std=[1.0] * Z_DIM,
        scale_factor_temporal=2,
        scale_factor_spatial=4,
    )


def make_transformer(text_dim: int) -> WanTransformer3DModel:
    """Wan DiT on 8x5x8x8 latents: patch (1, 2, 2) -> 80 tokens, 4 blocks of width 128 (4 heads of 32)."""
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        in_channels=Z_DIM,
        out_channels=Z_DIM,
        text_dim=text_dim,
        freq_dim=64,
        ffn_dim=512,
        num_layers=4,
        num_attention_heads=4,
        attention_head_dim=32,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=64,
    )


def make_text_parts(seed: int = 0):
    """(tokenizer, frozen random UMT5 encoder) whose vocabulary holds every caption word."""
    tokenizer = te.make_t5_tokenizer(model_max_length=CONTEXT, extra_words=md.EXTRA_WORDS)
    config = te.t5_config(tokenizer, width=64, layers=2, heads=2)
    encoder = seeded(seed, UMT5EncoderModel, UMT5Config(**config.to_dict()))
    return tokenizer, encoder.eval().requires_grad_(False)


def make_scheduler() -> UniPCMultistepScheduler:
    return UniPCMultistepScheduler(**dict(WAN_SCHEDULER, flow_shift=FLOW_SHIFT))


class MultiplicityCrossAttnProcessor:
    """Wan's cross-attention (``WanAttnProcessor`` without image context) with a per-token logit bias: a zero
    token with bias ``log(k)`` counts as ``k`` identical tokens. Set ``bias`` (batch, 1, 1, tokens) per call."""

    bias: torch.Tensor | None = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        def heads(x):
            return x.unflatten(2, (attn.heads, -1)).transpose(1, 2)

        query = heads(attn.norm_q(attn.to_q(hidden_states)))
        key = heads(attn.norm_k(attn.to_k(encoder_hidden_states)))
        value = heads(attn.to_v(encoder_hidden_states))
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=self.bias.to(query.dtype))
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))
