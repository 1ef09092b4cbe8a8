"""Exact references for schedule tuning, and the distance to them (``ode_error``).

Models whose ODE has an exact solve register it here (``fastdiff.zoo.gmm_exact`` for the VP mixture,
``fastdiff.zoo.gmm_flow`` for the flow one): a pipeline of theirs exists only once their module is imported,
so the tuner finds the solve without importing any model. ``fastdiff.schedulers.tuning`` takes a registered
solve that accepts the pipeline as the reference, and a high-NFE run otherwise.

Example::

    from fastdiff.schedulers.exact import exact_references, ode_error

    refs, how = exact_references(pipe, batch=16, seeds=[0, 1], kind="noise")  # None for other models
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

ExactSolve = Callable[[Any, int, int], torch.Tensor]  # (pipe, batch, seed) -> exact samples, NCHW
# kind ("noise" | "flow") -> [(accepts(pipe) -> bool, solve, description)]
_EXACT: dict[str, list[tuple[Callable[[Any], bool], ExactSolve, str]]] = {"noise": [], "flow": []}


def register_exact(kind: str, accepts: Callable[[Any], bool], description: str):
    """Register ``solve(pipe, batch, seed)`` as the exact reference of the pipelines ``accepts`` takes."""

    def decorator(solve: ExactSolve) -> ExactSolve:
        _EXACT[kind].append((accepts, solve, description))
        return solve

    return decorator


def exact_references(pipe, batch: int, seeds: list[int], kind: str) -> tuple[dict, str] | None:
    """({seed: exact samples}, description) from the first registered solve that accepts ``pipe``, or None."""
    for accepts, solve, description in _EXACT[kind]:
        if accepts(pipe):
            return {s: solve(pipe, batch, s) for s in seeds}, description
    return None


def _as_nchw(samples, like_shape: tuple[int, ...]) -> torch.Tensor:
    # numpy images from output_type="np" are (N, H, W, C); everything else is (N, C, H, W).
    tensor = torch.as_tensor(np.asarray(samples) if not isinstance(samples, torch.Tensor) else samples)
    tensor = tensor.detach().double().cpu()
    if (
        tuple(tensor.shape) != like_shape
        and tensor.ndim == 4
        and tuple(tensor.permute(0, 3, 1, 2).shape) == like_shape
    ):
        tensor = tensor.permute(0, 3, 1, 2)
    if tuple(tensor.shape) != like_shape:
        raise ValueError(f"samples have shape {tuple(tensor.shape)}; expected {like_shape} (NCHW) or its NHWC")
    return tensor


def ode_error(samples, exact) -> float:
    """Mean over samples of the L2 distance (over all C*H*W values) between ``samples`` and ``exact``.

    Accepts torch (N, C, H, W) or the pipeline's numpy (N, H, W, C) images for either argument.

    >>> ode_error(torch.zeros(2, 1, 8, 8), torch.ones(2, 1, 8, 8))
    8.0
    """
    exact = torch.as_tensor(exact).detach().double().cpu()
    if exact.ndim != 4:
        raise ValueError(f"exact has shape {tuple(exact.shape)}; expected 4 dims (N, C, H, W)")
    samples = _as_nchw(samples, tuple(exact.shape))
    return float((samples - exact).flatten(1).norm(dim=1).mean())
