"""The model-specific quality evaluators, by pipeline class name.

A model's own module registers its evaluator (``fastdiff.zoo.gmm_exact`` for ``GMMPipeline``); so a pipeline of
that class exists only once its evaluator is registered, and nothing here imports the models.

Example::

    from fastdiff.eval.registry import register_quality

    @register_quality("MyPipeline")
    def my_quality(pipe, call_kwargs, images, seed=0):
        return {"score": float(images.mean())}
"""

from __future__ import annotations

from collections.abc import Callable

# fn(pipe, call_kwargs: dict, images: np.ndarray (N,H,W,C) or raw samples, seed: int) -> dict[str, float]
QualityFn = Callable[..., dict]
QUALITY: dict[str, QualityFn] = {}


def register_quality(pipeline_class_name: str):
    """Register a quality evaluator for pipelines of class ``pipeline_class_name``."""

    def decorator(fn: QualityFn) -> QualityFn:
        QUALITY[pipeline_class_name] = fn
        return fn

    return decorator
