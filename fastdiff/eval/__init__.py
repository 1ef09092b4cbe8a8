"""Quality metrics: fidelity to a reference output, and model-specific quality (accuracy, FD, ODE error).

Model-specific evaluators register per pipeline class (``fastdiff.eval.registry``), so ``fastdiff bench`` adds
them to any model that has one.
"""

from __future__ import annotations

from fastdiff.eval.registry import QUALITY, QualityFn, register_quality


def quality_for(pipe) -> QualityFn | None:
    """The evaluator registered for ``pipe``'s class, or None."""
    # The digits evaluators live in eval.quality; the exact models' (GMM) in their own modules, which are
    # imported wherever one of their pipelines exists.
    from fastdiff.eval import quality, quality_video  # noqa: F401

    return QUALITY.get(type(pipe).__name__)


__all__ = ["QUALITY", "register_quality", "quality_for"]
