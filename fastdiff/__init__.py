"""fastdiff: composable, reversible accelerators for Hugging Face diffusers pipelines.

Example::

    from fastdiff import FastPipeline
    fp = FastPipeline.from_pretrained("path/to/pipeline", accelerators="scheduler(name=dpm++2m,steps=20)")
    images = fp(prompt="a watercolor fox").images
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

from fastdiff.core import (
    Accelerator,
    AcceleratorError,
    FastPipeline,
    Handle,
    NonFiniteOutputError,
    UnsupportedModelError,
    available,
    parse,
    register,
)

try:
    __version__ = _installed_version("fastdiff-accel")  # the installed distribution's metadata
except PackageNotFoundError:  # a source tree on sys.path, not installed: pyproject.toml's version
    __version__ = "0.1.0"

# fastdiff's own pipelines; importing them registers their classes with diffusers, so that
# DiffusionPipeline.from_pretrained loads saved fastdiff pipelines after `import fastdiff`.
from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline  # noqa: E402
from fastdiff.zoo.gmm_flow import GMMFlowDenoiser, GMMFlowPipeline  # noqa: E402
from fastdiff.zoo.pipelines import ClassConditionalPipeline  # noqa: E402

__all__ = [
    "Accelerator", "AcceleratorError", "FastPipeline", "Handle", "NonFiniteOutputError",
    "UnsupportedModelError", "available", "parse", "register", "ClassConditionalPipeline", "GMMDenoiser",
    "GMMFlowDenoiser", "GMMFlowPipeline", "GMMPipeline",
]  # fmt: skip
