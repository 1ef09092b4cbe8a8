"""Quality metrics: fidelity to a reference output, and model-specific quality (accuracy, FD, ODE error).

Model-specific evaluators register per pipeline class, so ``fastdiff bench`` adds them to any model that has one.
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


def quality_for(pipe) -> QualityFn | None:
    """The evaluator registered for ``pipe``'s class, or None."""
    _load_evaluators()
    return QUALITY.get(type(pipe).__name__)


def _load_evaluators() -> None:
    from fastdiff.eval import quality  # noqa: F401
    from fastdiff.zoo import gmm, gmm_flow  # noqa: F401


__all__ = ["QUALITY", "register_quality", "quality_for"]
