"""fastdiff: composable, reversible accelerators for Hugging Face diffusers pipelines.

Example::

    from fastdiff import FastPipeline
    fp = FastPipeline.from_pretrained("path/to/pipeline", accelerators="scheduler(name=dpm++2m,steps=20)")
    images = fp(prompt="a watercolor fox").images
"""

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

__version__ = "0.1.0"

_LAZY = {
    "ClassConditionalPipeline": "fastdiff.zoo.pipelines",
    "GMMPipeline": "fastdiff.zoo.gmm",
    "GMMDenoiser": "fastdiff.zoo.gmm",
}


def __getattr__(name: str):
    # Lazy so that `import fastdiff` stays light; diffusers resolves saved fastdiff classes through this.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fastdiff' has no attribute {name!r}")


__all__ = [
    "Accelerator", "AcceleratorError", "FastPipeline", "Handle", "NonFiniteOutputError",
    "UnsupportedModelError", "available", "parse", "register", *_LAZY,
]  # fmt: skip
