"""Sibling pipelines: another pipeline class (or the same) over one pipeline's modules, sharing them.

Example::

    from diffusers import StableDiffusionImg2ImgPipeline
    from fastdiff.core.siblings import sibling

    img2img = sibling(pipe, StableDiffusionImg2ImgPipeline)  # same UNet, VAE, text encoder objects
"""

from __future__ import annotations

from diffusers.utils import logging as diffusers_logging


def sibling(pipe, cls=None, **components):
    """``cls.from_pipe(pipe, **components)`` (default: the same class): a pipeline sharing ``pipe``'s modules."""
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # from_pipe warns about dtype casts it does not make here
    try:
        twin = (cls or type(pipe)).from_pipe(pipe, **components)
    finally:
        diffusers_logging.set_verbosity(level)
    if "default_sample_size" in pipe.__dict__:  # a tiny build's own default size (fastdiff.zoo.tiny_flow)
        twin.default_sample_size = pipe.default_sample_size
    return twin
