"""The digits-flow model itself: its constants, transformer, scheduler and the attention processor that counts
the pipeline's zero "T5" tokens as one (:mod:`fastdiff.zoo.reference_flow` trains, builds and scores it)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    SD3Transformer2DModel,
)

LATENT_SIDE = 8
MAX_SEQUENCE_LENGTH = 256  # the pipeline's default: this many zero "T5" tokens follow the CLIP tokens
SHIFT = 1.0  # FlowMatchEulerDiscreteScheduler's shift: none at 8x8 latents (SD3 uses 3.0 at 128x128)
DEFAULT_GUIDANCE = 1.5  # the guidance this model is benchmarked at (the pipeline's own default is 7.0)
PROMPT_DROPOUT = 0.1
SIZES = {
    "test": dict(steps=40),
    "bench": dict(steps=18000),  # the shipped build: 2 h 13 min on one CPU thread (2.3 steps/s, a shared core)
}


def make_transformer(joint_attention_dim: int = 128, pooled_projection_dim: int = 128) -> SD3Transformer2DModel:
    """MMDiT on 4x8x8 latents: patch 2 (16 image tokens), 6 joint blocks, width 128 (4 heads of 32), 3.5M
    parameters; context = the two CLIP encoders' penultimate states side by side (2 x 64 = 128 wide)."""
    return SD3Transformer2DModel(
        sample_size=LATENT_SIDE,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=6,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=joint_attention_dim,
        caption_projection_dim=128,
        pooled_projection_dim=pooled_projection_dim,
        pos_embed_max_size=LATENT_SIDE // 2,
    )


def make_scheduler() -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT)


class MultiplicityJointAttnProcessor:
    """diffusers' ``JointAttnProcessor2_0`` where the last context token counts ``count`` times (a logit bias
    of ``log(count)``): exactly the attention over ``count`` identical copies of it."""

    def __init__(self, count: int):
        self.log_count = math.log(count)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        batch, image_tokens = hidden_states.shape[:2]

        def heads(x, norm=None):
            x = x.view(batch, -1, attn.heads, x.shape[-1] // attn.heads).transpose(1, 2)
            return norm(x) if norm is not None else x

        query = torch.cat(
            [
                heads(attn.to_q(hidden_states), attn.norm_q),
                heads(attn.add_q_proj(encoder_hidden_states), attn.norm_added_q),
            ],
            dim=2,
        )
        key = torch.cat(
            [
                heads(attn.to_k(hidden_states), attn.norm_k),
                heads(attn.add_k_proj(encoder_hidden_states), attn.norm_added_k),
            ],
            dim=2,
        )
        value = torch.cat([heads(attn.to_v(hidden_states)), heads(attn.add_v_proj(encoder_hidden_states))], dim=2)
        bias = torch.zeros(key.shape[2], dtype=query.dtype, device=query.device)
        bias[-1] = self.log_count
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias.view(1, -1))
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * out.shape[-1]).to(query.dtype)
        hidden_states, encoder_hidden_states = out[:, :image_tokens], out[:, image_tokens:]
        if not attn.context_pre_only:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return attn.to_out[1](attn.to_out[0](hidden_states)), encoder_hidden_states
