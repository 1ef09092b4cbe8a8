"""``tiny-vae(path=DIR)``: decode with a tiny autoencoder's decoder (diffusers' ``AutoencoderTiny``, TAESD-style)
instead of the pipeline's ``AutoencoderKL`` decoder.

At one or two denoiser calls per image the VAE decode can dominate a call (three quarters of a one-step call at
SD 1.5 size on a CPU: ``benchmarks/onestep_split.py``). ``DIR`` is an ``AutoencoderTiny`` saved with
``save_pretrained``: one trained here for a reference (``fastdiff distill tiny-vae MODEL OUT``) or a published
TAESD for the same latent space. Its decoder reads the denoiser's latents, as TAESD's do: the pipeline's
``latents / scaling_factor + shift_factor`` is mapped back before the tiny decoder runs. Hooks on the VAE's
``post_quant_conv`` (skipped) and ``decoder`` (replaced) do the swap, so tiled and sliced decoding keep working
and encoding is untouched. ``remove()`` takes the hooks off: outputs are bit-identical to before. The quality
cost is measured, not assumed: ``benchmarks/tiny_vae.py``.

Example::

    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained("/tmp/digits-sd")
    handle = fp.accelerate("tiny-vae(path=/tmp/digits-sd-taesd)")
    images = fp(prompt=["a handwritten seven"], output_type="np").images
    handle.remove()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, install_hooks
from fastdiff.core.models import UnsupportedModelError, family_name
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

# image VAEs whose decode runs post_quant_conv, then decoder (the two modules the hooks replace)
SUPPORTED_VAES = ("AutoencoderKL",)


def load_tiny_vae(path: str | Path):
    """The ``AutoencoderTiny`` saved in ``path``; a clear error when there is none."""
    from diffusers import AutoencoderTiny

    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise AcceleratorError(
            f"tiny-vae: {str(path)!r} holds no AutoencoderTiny (no config.json); make one with "
            "`fastdiff distill tiny-vae MODEL OUT` or pass a TAESD directory"
        )
    tiny = AutoencoderTiny.from_pretrained(path)
    return tiny.eval().requires_grad_(False)


def upsampling(tiny_config) -> int:
    """Pixels per latent pixel of an ``AutoencoderTiny`` decoder (it upsamples between its blocks)."""
    return tiny_config.upsampling_scaling_factor ** (len(tiny_config.decoder_block_out_channels) - 1)


def check_fits(vae, tiny) -> None:
    """Refuse a tiny decoder whose latent channels, image channels or upsampling differ from the VAE's."""
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    ours = (vae.config.latent_channels, vae.config.out_channels, factor)
    theirs = (tiny.config.latent_channels, tiny.config.out_channels, upsampling(tiny.config))
    if ours != theirs:
        raise AcceleratorError(
            f"tiny-vae: the tiny decoder does not fit this VAE: (latent channels, image channels, upsampling) "
            f"{theirs} against the VAE's {ours}"
        )


class _Skip(ModelHook):
    """On ``post_quant_conv``: the tiny decoder reads the latents before it."""

    def new_forward(self, module, *args, **kwargs):
        return args[0]


class _TinyDecode(ModelHook):
    """On the VAE's ``decoder``: the tiny decoder on the denoiser-space latents, output in [-1, 1] like the VAE's."""

    def __init__(self, decoder: torch.nn.Module, scale: float, shift: float):
        super().__init__()
        self.decoder, self.scale, self.shift = decoder, scale, shift

    def new_forward(self, module, *args, **kwargs):
        z = args[0] if args else kwargs["z"]
        # the pipeline may have upcast its VAE since apply (SDXL's force_upcast)
        if next(self.decoder.parameters()).dtype != z.dtype:
            self.decoder.to(z.dtype)
        return self.decoder((z - self.shift) * self.scale)


@register
@dataclass(frozen=True)
class TinyVae(Accelerator):
    """Decode with a tiny (TAESD-style) decoder. Example: ``fp.accelerate("tiny-vae(path=/tmp/taesd)")``.

    ``path``: a directory with an ``AutoencoderTiny`` for this pipeline's latent space.
    """

    path: str

    spec_name = "tiny-vae"
    kind = "compress"
    touches = frozenset({"vae.decode"})
    exclusive = frozenset({"vae.decode"})

    def apply(self, fp: FastPipeline) -> Handle:
        vae = getattr(fp.pipe, "vae", None)
        if type(vae).__name__ not in SUPPORTED_VAES:
            raise UnsupportedModelError(
                f"tiny-vae: the {family_name(fp.pipe)} pipeline's autoencoder is "
                f"{type(vae).__name__ if vae is not None else 'none'}; supported: {', '.join(SUPPORTED_VAES)}"
            )
        tiny = load_tiny_vae(self.path)
        check_fits(vae, tiny)
        decoder = tiny.decoder.to(device=vae.device, dtype=vae.dtype)
        hook = _TinyDecode(decoder, vae.config.scaling_factor, vae.config.shift_factor or 0.0)
        pairs = [(vae.decoder, hook)]
        if vae.post_quant_conv is not None:
            pairs.append((vae.post_quant_conv, _Skip()))
        return install_hooks(pairs, "fastdiff.tiny-vae", fp.context)
