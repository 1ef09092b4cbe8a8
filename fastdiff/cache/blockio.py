"""Reading and building a transformer block's inputs and outputs through diffusers' block metadata.

``io`` is the ``TransformerBlockMetadata`` that ``fastdiff.core.denoisers.block_io`` returns for a block: the name of
its image-state argument (and text-state argument) and where each sits in its output tuple, if it returns one.
"""

from __future__ import annotations

import torch

from fastdiff.core.denoisers import REUSABLE_LAYERS, denoiser_facts
from fastdiff.core.diffusers_compat import block_argument
from fastdiff.core.models import UnsupportedModelError


def blocks_in_order(model, facts) -> list[torch.nn.Module]:
    """A transformer denoiser's blocks, in the order of the block lists its facts name."""
    return [b for name in facts.blocks for b in getattr(model, name)]


def first_and_last_blocks(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The first and last transformer blocks of a denoiser (its facts name the block lists)."""
    blocks = blocks_in_order(model, denoiser_facts(model, "blockcache"))
    return blocks[0], blocks[-1]


def hidden_in(io, args, kwargs) -> torch.Tensor:
    return block_argument(io, io.hidden_states_argument_name, args, kwargs)


def hidden_out(io, output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[io.return_hidden_states_index]


def with_hidden(io, output, hidden: torch.Tensor):
    """``output`` with its image states replaced by ``hidden``."""
    if isinstance(output, torch.Tensor):
        return hidden
    parts = list(output)
    parts[io.return_hidden_states_index] = hidden
    return type(output)(parts)


def passed_through(io, args, kwargs, hidden: torch.Tensor | None = None):
    """What a skipped block returns: its inputs, in the places its output has them (``hidden``: its image states,
    if already read)."""
    hidden = hidden_in(io, args, kwargs) if hidden is None else hidden
    if io.return_encoder_hidden_states_index is None:
        return hidden
    encoder = block_argument(io, io.encoder_hidden_states_argument_name, args, kwargs)
    parts = [None] * (max(io.return_hidden_states_index, io.return_encoder_hidden_states_index) + 1)
    parts[io.return_hidden_states_index] = hidden
    parts[io.return_encoder_hidden_states_index] = encoder
    return tuple(parts)


def attention_layers(model, accelerator: str) -> list[torch.nn.Module]:
    """The attention layers of a transformer denoiser's blocks, in block order: those of the blocks' reusable
    layers (``REUSABLE_LAYERS``) that are diffusers attention modules. UnsupportedModelError for a UNet or a block
    without facts."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    facts = denoiser_facts(model, accelerator)
    if facts.family != "transformer":
        raise UnsupportedModelError(
            f"{accelerator} needs a transformer denoiser; {type(model).__name__} is a {facts.family}"
        )
    layers = []
    for block in blocks_in_order(model, facts):
        names = REUSABLE_LAYERS.get(type(block).__name__)
        if names is None:
            raise UnsupportedModelError(f"{accelerator} has no layer facts for {type(block).__name__}")
        found = (getattr(block, name, None) for name in names)
        layers += [m for m in found if isinstance(m, (Attention, AttentionModuleMixin))]
    return layers
