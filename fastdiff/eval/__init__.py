"""Quality metrics: fidelity to a reference output, and model-specific quality (accuracy, FD, ODE error).

Model-specific evaluators register per pipeline class (``fastdiff.eval.registry``), so ``fastdiff bench`` adds
them to any model that has one.
"""

from __future__ import annotations

from functools import cache

from fastdiff.core import plugins
from fastdiff.eval.registry import QUALITY, QualityFn, register_quality


@cache
def _load_evaluators() -> None:
    plugins.load_plugins(plugins.QUALITY)  # the modules that register evaluators (the references')


def quality_for(pipe) -> QualityFn | None:
    """The evaluator registered for ``pipe``'s class, or None. Evaluators come from the modules of the
    ``fastdiff.quality`` entry points, and from a model's own module (the GMM models register on import)."""
    _load_evaluators()
    return QUALITY.get(type(pipe).__name__)


__all__ = ["QUALITY", "register_quality", "quality_for"]
