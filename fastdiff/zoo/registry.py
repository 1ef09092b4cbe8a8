"""The zoo's builders by model name; each builder module registers its own with ``register_model``.

Example::

    from fastdiff.zoo.registry import register_model

    @register_model("my-model", sizes=("test",))
    def build_my_model(out_dir, size, seed):
        make_my_pipeline(size, seed).save_pretrained(out_dir)
"""

from __future__ import annotations

from collections.abc import Callable

Builder = Callable[..., None]
ZOO: dict[str, tuple[Builder, tuple[str, ...]]] = {}


def register_model(name: str, sizes: tuple[str, ...] = ("test", "bench")):
    """Register ``fn(out_dir: Path, size: str, seed: int) -> None`` as the builder of ``name``."""

    def decorator(fn: Builder) -> Builder:
        ZOO[name] = (fn, sizes)
        return fn

    return decorator
