"""Model builders: every model fastdiff tests and benchmarks on is built here, offline.

Each builder writes a diffusers pipeline directory that ``FastPipeline.from_pretrained`` loads.

Example::

    from fastdiff.zoo import build
    path = build("tiny-sd", "/tmp/tiny-sd", size="test")
"""

from __future__ import annotations

from pathlib import Path

from fastdiff.zoo.registry import ZOO, Builder, register_model  # noqa: F401  (the public names of the zoo)


def available() -> list[str]:
    _load_builders()
    return sorted(ZOO)


def build(name: str, out_dir: str | Path, size: str = "test", seed: int = 0) -> Path:
    """Build model ``name`` at ``size`` into ``out_dir`` and return the directory."""
    _load_builders()
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; available: {', '.join(sorted(ZOO))}")
    fn, sizes = ZOO[name]
    if size not in sizes:
        raise ValueError(f"zoo model {name!r} has no size {size!r}; allowed: {', '.join(sizes)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fn(out, size=size, seed=seed)
    return out


def _load_builders() -> None:
    # Importing the modules runs their @register_model decorators.
    # full_size: sd15, sdxl, dit-xl-2 and sd35-medium at their published layouts (size "full")
    from fastdiff.zoo import (  # noqa: F401
        full_size,
        gmm,
        gmm_flow,
        onestep,
        reference,
        reference_flow,
        reference_sd,
        reference_video,
        tiny,
        tiny_flow,
        tiny_video,
    )
