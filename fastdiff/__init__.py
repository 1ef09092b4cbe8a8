"""fastdiff: composable, reversible accelerators for Hugging Face diffusers pipelines.

Example::

    from fastdiff import FastPipeline
    fp = FastPipeline.from_pretrained("path/to/pipeline", accelerators="scheduler(name=dpm++2m,steps=20)")
    images = fp(prompt="a watercolor fox").images
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:
    __version__ = _installed_version("fastdiff-accel")  # the installed distribution's metadata
except PackageNotFoundError:  # a source tree on sys.path, not installed: pyproject.toml's version
    __version__ = "0.1.0"

__all__ = [
    "Accelerator",
    "AcceleratorError",
    "FastPipeline",
    "Handle",
    "NonFiniteOutputError",
    "UnsupportedModelError",
    "available",
    "load_pipeline",
    "parse",
    "register",
]


def __getattr__(name: str):
    # the core (torch, diffusers: ~20 s on a slow CPU) loads at first use, so `fastdiff --version` is instant
    if name in __all__:
        from fastdiff import core

        return getattr(core, name)
    raise AttributeError(f"module 'fastdiff' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
