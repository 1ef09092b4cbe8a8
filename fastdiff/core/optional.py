"""Optional packages: what needs them and how to install them.

The base install carries what every pipeline needs; the accelerators and tools that need more declare it
(``Accelerator.needs``), and a missing package is named with the pip extra that installs it, before anything
changes, instead of failing half-way through ``apply``.

Example::

    from fastdiff.core.optional import require
    tp = require("torch_pruning", "prune")   # MissingDependency: "... pip install 'fastdiff-accel[compress]'"
"""

from __future__ import annotations

import importlib
import importlib.util

from fastdiff.core.registry import AcceleratorError

# module -> the extra of fastdiff-accel that installs it
EXTRAS = {
    "torch_pruning": "compress",
    "torchao": "compress",
    "onnx": "compress",
    "onnxruntime": "compress",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "ray": "ray",
}


class MissingDependency(AcceleratorError, ImportError):
    """An optional package is not installed (an ``ImportError``, and an ``AcceleratorError`` for accelerators)."""


def install_hint(module: str) -> str:
    extra = EXTRAS.get(module)
    return f"pip install 'fastdiff-accel[{extra}]'" if extra else f"pip install {module}"


def missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None in sys.modules
        return True


def require(module: str, who: str):
    """``module`` imported, or ``MissingDependency`` naming ``who`` needs it and the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependency(
            f"{who} needs the optional package {module!r}, which is not installed: {install_hint(module)}"
        ) from error


def check_needs(configs) -> None:
    """``MissingDependency`` for the first config whose declared ``needs`` are not installed."""
    for config in configs:
        for module in config.needs:
            if missing(module):
                raise MissingDependency(
                    f"{config} needs the optional package {module!r}, which is not installed: {install_hint(module)}"
                )


__all__ = ["EXTRAS", "MissingDependency", "require", "check_needs", "install_hint"]
