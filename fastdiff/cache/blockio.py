"""Reading and building a transformer block's inputs and outputs through diffusers' block metadata.

``io`` is the ``TransformerBlockMetadata`` that ``fastdiff.core.models.block_io`` returns for a block: the name of
its image-state argument (and text-state argument) and where each sits in its output tuple, if it returns one.
"""

from __future__ import annotations

import torch

from fastdiff.core.models import denoiser_facts


def first_and_last_blocks(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The first and last transformer blocks of a denoiser (its facts name the block lists)."""
    facts = denoiser_facts(model, "blockcache")
    blocks = [b for name in facts.blocks for b in getattr(model, name)]
    return blocks[0], blocks[-1]


def hidden_in(io, args, kwargs) -> torch.Tensor:
    return io._get_parameter_from_args_kwargs(io.hidden_states_argument_name, args, kwargs)


def hidden_out(io, output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[io.return_hidden_states_index]


def with_hidden(io, output, hidden: torch.Tensor):
    """``output`` with its image states replaced by ``hidden``."""
    if isinstance(output, torch.Tensor):
        return hidden
    parts = list(output)
    parts[io.return_hidden_states_index] = hidden
    return type(output)(parts)


def passed_through(io, args, kwargs):
    """What a skipped block returns: its inputs, in the places its output has them."""
    hidden = hidden_in(io, args, kwargs)
    if io.return_encoder_hidden_states_index is None:
        return hidden
    encoder = io._get_parameter_from_args_kwargs(io.encoder_hidden_states_argument_name, args, kwargs)
    parts = [None] * (max(io.return_hidden_states_index, io.return_encoder_hidden_states_index) + 1)
    parts[io.return_hidden_states_index] = hidden
    parts[io.return_encoder_hidden_states_index] = encoder
    return tuple(parts)
