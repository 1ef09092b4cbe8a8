"""Per-denoiser facts: where each denoiser's blocks are, which of their layers may be reused or staged, and how
its blocks take and return their states. The pipelines' facts live beside it in ``fastdiff.core.models``.

An accelerator asks ``denoiser_facts(module, name)``; a denoiser with no entry fails loudly at ``apply``
(``UnsupportedModelError`` naming what is supported).

Example::

    from fastdiff.core.denoisers import denoiser_facts
    facts = denoiser_facts(pipe.unet, "deepcache")   # DenoiserFacts(family="unet", blocks=(...), ...)
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

from fastdiff.core.diffusers_compat import block_metadata_registry
from fastdiff.core.models import UnsupportedModelError


@dataclass(frozen=True)
class DenoiserFacts:
    family: str  # "unet" (down/mid/up blocks with skips) or "transformer" (a stack of blocks)
    blocks: tuple[str, ...]  # attribute names of the block lists/modules, outermost first
    attention_blocks: tuple[str, ...] = ()  # class names of blocks whose self-attention may be touched
    # Modules that parallel(mode=async) may assign to stages, as dotted patterns ("*" = one name component);
    # they run one after another, each once per forward (the order is recorded at the first call).
    stage_units: tuple[str, ...] = ()
    # The last blocks return the text (and reference) tokens joined before the image tokens (Flux.2's single-stream
    # blocks): blockcache's first-block and TeaCache modes read the image residual from the trailing tokens.
    joined_last_block: bool = False
    # Why diffusers' context parallelism gives wrong results or fails on this denoiser despite its plan ("": runs).
    no_sequence_parallel: str = ""


# UNets: conv_in, every layer inside the down/mid/up blocks (resnets, attentions, samplers), the output convs.
_UNET_UNITS = (
    "conv_in",
    "down_blocks.*.*.*",
    "mid_block.*.*",
    "up_blocks.*.*.*",
    "conv_norm_out",
    "conv_out",
)


# Flow transformers: the embedders, every block (a dual-stream block's output is its (text, image) pair), the head.
_SD3_UNITS = (
    "pos_embed",
    "time_text_embed",
    "context_embedder",
    "transformer_blocks.*",
    "norm_out",
    "proj_out",
)
_FLUX_UNITS = (
    "x_embedder",
    "time_text_embed",
    "context_embedder",
    "transformer_blocks.*",
    "single_transformer_blocks.*",
    "norm_out",
    "proj_out",
)
_FLUX2_UNITS = (
    "x_embedder",
    "context_embedder",
    "time_guidance_embed",
    "double_stream_modulation_img",
    "double_stream_modulation_txt",
    "single_stream_modulation",
    "transformer_blocks.*",
    "single_transformer_blocks.*",
    "norm_out",
    "proj_out",
)
_QWEN_IMAGE_UNITS = ("img_in", "txt_norm", "txt_in", "time_text_embed", "transformer_blocks.*", "norm_out", "proj_out")
_ZIMAGE_UNITS = (
    "all_x_embedder.*",
    "t_embedder",
    "cap_embedder",
    "noise_refiner.*",
    "context_refiner.*",
    "layers.*",
    "all_final_layer.*",
)
_SANA_UNITS = (
    "patch_embed",
    "time_embed",
    "caption_projection",
    "caption_norm",
    "transformer_blocks.*",
    "norm_out",
    "proj_out",
)
_PIXART_UNITS = (
    "pos_embed",
    "adaln_single",
    "caption_projection",
    "transformer_blocks.*",
    "norm_out",
    "proj_out",
)

# Video transformers, in the order their forward calls them (rotary tables and reshapes run on every stage).
_WAN_UNITS = ("patch_embedding", "condition_embedder", "blocks.*", "norm_out", "proj_out")
_COGVIDEOX_UNITS = (
    "time_embedding",
    "patch_embed",
    "transformer_blocks.*",
    "norm_final",
    "norm_out",
    "proj_out",
)
_LTX_UNITS = ("proj_in", "time_embed", "caption_projection", "transformer_blocks.*", "norm_out", "proj_out")
_HUNYUAN_VIDEO_UNITS = (
    "x_embedder",
    "context_embedder",
    "time_text_embed",
    "transformer_blocks.*",
    "single_transformer_blocks.*",
    "norm_out",
    "proj_out",
)


DENOISERS: dict[str, DenoiserFacts] = {
    "UNet2DConditionModel": DenoiserFacts(
        "unet", ("down_blocks", "mid_block", "up_blocks"), ("BasicTransformerBlock",), _UNET_UNITS
    ),
    "UNet2DModel": DenoiserFacts("unet", ("down_blocks", "mid_block", "up_blocks"), ("Attention",), _UNET_UNITS),
    "DiTTransformer2DModel": DenoiserFacts(
        "transformer",
        ("transformer_blocks",),
        ("BasicTransformerBlock",),
        ("pos_embed", "transformer_blocks.*", "proj_out_2"),
    ),
    # Flow-matching transformers: dual-stream (text and image) blocks, then single-stream ones (Flux).
    "FluxTransformer2DModel": DenoiserFacts(
        "transformer",
        ("transformer_blocks", "single_transformer_blocks"),
        stage_units=_FLUX_UNITS,
    ),
    "Flux2Transformer2DModel": DenoiserFacts(
        "transformer",
        ("transformer_blocks", "single_transformer_blocks"),
        stage_units=_FLUX2_UNITS,
        joined_last_block=True,
    ),
    "SD3Transformer2DModel": DenoiserFacts("transformer", ("transformer_blocks",), stage_units=_SD3_UNITS),
    "QwenImageTransformer2DModel": DenoiserFacts(
        "transformer", ("transformer_blocks",), stage_units=_QWEN_IMAGE_UNITS
    ),
    "ZImageTransformer2DModel": DenoiserFacts("transformer", ("layers",), stage_units=_ZIMAGE_UNITS),
    "SanaTransformer2DModel": DenoiserFacts("transformer", ("transformer_blocks",), stage_units=_SANA_UNITS),
    "PixArtTransformer2DModel": DenoiserFacts(
        "transformer", ("transformer_blocks",), ("BasicTransformerBlock",), stage_units=_PIXART_UNITS
    ),
    # Video transformers: one stack of blocks over (frames x height x width) patches and the text (HunyuanVideo:
    # dual-stream, then single-stream, like Flux).
    "WanTransformer3DModel": DenoiserFacts("transformer", ("blocks",), stage_units=_WAN_UNITS),
    "CogVideoXTransformer3DModel": DenoiserFacts("transformer", ("transformer_blocks",), stage_units=_COGVIDEOX_UNITS),
    "LTXVideoTransformer3DModel": DenoiserFacts(
        "transformer",
        ("transformer_blocks",),
        stage_units=_LTX_UNITS,
        no_sequence_parallel="diffusers' Ulysses attention gathers LTX's per-head text mask over the sequence but "
        "not over the heads, so attention fails on a shape mismatch (diffusers 0.42)",
    ),
    "HunyuanVideoTransformer3DModel": DenoiserFacts(
        "transformer", ("transformer_blocks", "single_transformer_blocks"), stage_units=_HUNYUAN_VIDEO_UNITS
    ),
}

# Sub-layers of each block class whose outputs fixed-interval block caching (FORA) may reuse: attention and MLPs.
REUSABLE_LAYERS: dict[str, tuple[str, ...]] = {
    "BasicTransformerBlock": ("attn1", "attn2", "ff"),
    "FluxTransformerBlock": ("attn", "ff", "ff_context"),
    "FluxSingleTransformerBlock": ("attn", "proj_mlp"),
    "Flux2TransformerBlock": ("attn", "ff", "ff_context"),
    "Flux2SingleTransformerBlock": ("attn",),
    "JointTransformerBlock": ("attn", "attn2", "ff", "ff_context"),
    "QwenImageTransformerBlock": ("attn", "img_mlp", "txt_mlp"),
    "ZImageTransformerBlock": ("attention", "feed_forward"),
    "SanaTransformerBlock": ("attn1", "attn2", "ff"),
    "WanTransformerBlock": ("attn1", "attn2", "ffn"),
    "CogVideoXBlock": ("attn1", "ff"),
    "LTXVideoTransformerBlock": ("attn1", "attn2", "ff"),
    "HunyuanVideoTransformerBlock": ("attn", "ff", "ff_context"),
    "HunyuanVideoSingleTransformerBlock": ("attn", "proj_mlp"),
}

# Where a block modulates its input by the timestep embedding (TeaCache's indicator): (norm submodule, embedding
# argument) for an adaLN norm called as ``norm(hidden_states, emb=<argument>)`` whose first output is the modulated
# input; (norm, argument, table) for adaLN-single blocks, which add the embedding to a learned (6, dim) table and
# compute ``norm(hidden_states) * (1 + scale) + shift`` from its first two rows; (norm, argument, "chunks:N") for
# blocks handed the modulation computed, as N equal chunks (shift, scale, gate, ...) of the argument's last dim.
MODULATION: dict[str, tuple[str, ...]] = {
    "FluxTransformerBlock": ("norm1", "temb"),
    "FluxSingleTransformerBlock": ("norm", "temb"),
    "JointTransformerBlock": ("norm1", "temb"),
    "HunyuanVideoTransformerBlock": ("norm1", "temb"),
    "HunyuanVideoSingleTransformerBlock": ("norm", "temb"),
    # PixArt's (norm_type ada_norm_single; DiT's BasicTransformerBlock has no table and is refused)
    "BasicTransformerBlock": ("norm1", "timestep", "scale_shift_table"),
    "SanaTransformerBlock": ("norm1", "timestep", "scale_shift_table"),
    "WanTransformerBlock": ("norm1", "temb", "scale_shift_table"),
    "LTXVideoTransformerBlock": ("norm1", "temb", "scale_shift_table"),
    # Flux.2: the modulation arrives computed, as (shift, scale, gate) x 2 chunks of one tensor
    "Flux2TransformerBlock": ("norm1", "temb_mod_img", "chunks:6"),
}


# Blocks diffusers' TransformerBlockRegistry lacks: where their outputs hold the image (and text) states.
BLOCK_IO: dict[str, dict] = {"SanaTransformerBlock": {"return_hidden_states_index": 0}}


def block_io(block):
    """diffusers' ``TransformerBlockMetadata`` of a block: where its hidden (and text) states go in and come out.

    diffusers keeps these for the blocks its own caches support; blocks it lacks are described here.
    """
    TransformerBlockMetadata, TransformerBlockRegistry = block_metadata_registry()

    try:
        io = TransformerBlockRegistry.get(type(block))
    except ValueError:
        if type(block).__name__ not in BLOCK_IO:
            raise UnsupportedModelError(f"no block facts for {type(block).__name__}") from None
        return TransformerBlockMetadata(**BLOCK_IO[type(block).__name__], _cls=type(block))
    params = list(inspect.signature(type(block).forward).parameters)[1:]
    if io.hidden_states_argument_name not in params:  # diffusers names Z-Image's ``x`` hidden_states
        io = dataclasses.replace(io, hidden_states_argument_name=params[0], _cached_parameter_indices=None)
    return io


def denoiser_facts(module, accelerator: str) -> DenoiserFacts:
    """Facts for a denoiser, or UnsupportedModelError naming the accelerator and what is supported."""
    name = type(module).__name__
    if name not in DENOISERS:
        raise UnsupportedModelError(
            f"{accelerator} does not support {name}; supported: {', '.join(sorted(DENOISERS))}"
        )
    return DENOISERS[name]
