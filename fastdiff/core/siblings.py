"""Sibling pipelines: another pipeline class (or the same) over one pipeline's modules, sharing them.

Example::

    from diffusers import StableDiffusionImg2ImgPipeline
    from fastdiff.core.siblings import sibling

    img2img = sibling(pipe, StableDiffusionImg2ImgPipeline)  # same UNet, VAE, text encoder objects
"""

from __future__ import annotations

from diffusers.utils import logging as diffusers_logging

# What an in-memory tiny build sets on its pipeline: its default size (fastdiff.zoo.tiny_flow) and its benchmark
# call (fastdiff.zoo.tiny_video: clip size and length)
BUILD_DEFAULTS = ("default_sample_size", "fastdiff_bench_call")


def sibling(pipe, cls=None, **components):
    """``cls.from_pipe(pipe, **components)`` (default: the same class): a pipeline sharing ``pipe``'s modules."""
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # from_pipe warns about dtype casts it does not make here
    try:
        twin = (cls or type(pipe)).from_pipe(pipe, **components)
    finally:
        diffusers_logging.set_verbosity(level)
    for name in BUILD_DEFAULTS:
        if name in pipe.__dict__:
            setattr(twin, name, pipe.__dict__[name])
    return twin
