"""``vae-tiling``: decode (and encode) in pieces through the autoencoder's own diffusers switches, so that peak
memory stops growing with the image size, the clip length and the batch.

- ``tiling``: spatial tiles (``vae.enable_tiling()``, the VAE's default tile sizes; tiles overlap and are blended);
- ``slicing``: one sample of the batch at a time (``vae.enable_slicing()``; exact);
- ``frames``: temporal tiles where the video VAE has them (``use_framewise_decoding`` / ``use_framewise_encoding``:
  LTX-Video, HunyuanVideo). Wan's VAE always decodes frame by frame through its causal cache and CogVideoX's in
  batches of latent frames, so there ``frames`` changes nothing.

The denoiser is untouched; only the decode step changes (tile blending moves pixels slightly: the measured figures
are in docs/video.md). ``remove()`` puts every switch back as it was.

Example::

    fp = FastPipeline.from_pretrained("/tmp/tiny-wan")
    fp.accelerate("vae-tiling")              # all three switches
    fp.accelerate("vae-tiling(tiling=false)")  # slicing and temporal tiles only
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastdiff.core.hooks import Handle
from fastdiff.core.models import UnsupportedModelError, family_name
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

# The autoencoder attributes the switches set (diffusers' own names), restored on remove().
_SWITCHES = ("use_tiling", "use_slicing", "use_framewise_decoding", "use_framewise_encoding")


@register
@dataclass(frozen=True)
class VaeTiling(Accelerator):
    """Decode in spatial tiles, one sample and (video) a few frames at a time. Example: ``"vae-tiling"``."""

    tiling: bool = True
    slicing: bool = True
    frames: bool = True

    spec_name = "vae-tiling"
    kind = "compress"
    touches = frozenset({"vae.decode"})
    exclusive = frozenset({"vae.decode"})

    def validate(self) -> None:
        if not (self.tiling or self.slicing or self.frames):
            raise AcceleratorError("vae-tiling: tiling, slicing and frames are all false; enable one")

    def apply(self, fp: FastPipeline) -> Handle:
        vae = getattr(fp.pipe, "vae", None)
        if vae is None or not hasattr(vae, "use_tiling"):
            raise UnsupportedModelError(
                f"vae-tiling: the {family_name(fp.pipe)} pipeline has no autoencoder with diffusers' tiling "
                f"switches (vae: {type(vae).__name__ if vae is not None else 'none'})"
            )
        before = {name: getattr(vae, name) for name in _SWITCHES if hasattr(vae, name)}
        if self.tiling:
            vae.enable_tiling()  # the VAE's own default tile sizes
        if self.slicing:
            vae.use_slicing = True  # what enable_slicing() sets; some video VAEs lack the method
        if self.frames:
            for name in ("use_framewise_decoding", "use_framewise_encoding"):
                if name in before:
                    setattr(vae, name, True)

        def restore():
            for name, value in before.items():
                setattr(vae, name, value)

        return Handle(restore)
