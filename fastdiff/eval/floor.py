"""Like-for-like FD floors: the best FD a generated set can expect, from real images drawn to match it.

A floor's real sample matches the generated one: the same count, the same class mix (each generated item gets a
distinct real train item of its class), several independent draws. The ratio FD / floor carries an interval from
a paired bootstrap over the generated items: each resample takes the same item indices from the generated set
and from one real draw (the draws taken in turn), so both sides get the same treatment; the interval is the
resampled ratios' spread about their median, set around the full-set ratio (repeats in a resample lower
diversity, which shifts FD itself, more on the more diverse side).

An item may be one image or several frames of one clip (``features`` of shape (items, frames, dim)): a clip's
frames show one digit, so a clip counts once.

Example::

    import numpy as np
    from fastdiff.eval.floor import matched_draw, ratio_to_floor

    idx = matched_draw(np.array([3, 3, 7]), y_train, np.random.default_rng(0))  # 2 distinct 3s and one 7
    stats = ratio_to_floor(gen_features, [real_features_0, real_features_1], test_features)
    print(stats["fd_floor"], stats["fd_ratio"], stats["fd_ratio_low"], stats["fd_ratio_high"])
"""

from __future__ import annotations

import numpy as np
import torch

from fastdiff.eval.fd_spread import FixedReference, _fd

FLOOR_DRAWS = 5  # independent like-for-like draws of real items per floor
RATIO_RESAMPLES = 200  # paired bootstrap resamples for the ratio's interval


def draw_rng(seed: int, draw: int) -> np.random.Generator:
    """The generator of floor draw ``draw`` for ``seed``: seeded by the pair, so no two (seed, draw) share a stream
    (``seed + draw`` made draw 1 of seed 0 the same as draw 0 of seed 1)."""
    return np.random.default_rng([seed, draw])


def matched_draw(wanted: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Indices into ``pool`` (class keys of the real items) with ``pool[idx] == wanted``, distinct where the pool
    allows; returns (indices, distinct). A class with fewer real items than wanted repeats them (distinct False).
    """
    wanted, pool = np.asarray(wanted), np.asarray(pool)
    missing = sorted(set(wanted.tolist()) - set(pool.tolist()))
    if missing:
        raise ValueError(f"no real item of class {missing} to match; the pool holds {sorted(set(pool.tolist()))}")
    out, distinct = np.empty(len(wanted), dtype=np.int64), True
    for key in np.unique(wanted):
        where, choices = np.flatnonzero(wanted == key), np.flatnonzero(pool == key)
        short = len(where) > len(choices)
        distinct &= not short
        out[where] = rng.choice(choices, size=len(where), replace=short)
    return out, bool(distinct)


def _flat(features: torch.Tensor) -> torch.Tensor:
    return features.reshape(-1, features.shape[-1])


def ratio_to_floor(
    gen: torch.Tensor,
    real_draws: list[torch.Tensor],
    test: torch.Tensor,
    resamples: int = RATIO_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """FD of ``gen`` and of each real draw against ``test``, the floor (median over draws) and the ratio with its
    paired-bootstrap interval.

    ``gen`` and each of ``real_draws``: features (items, dim) or (items, frames, dim), item ``i`` of a draw
    matched to generated item ``i``; ``test``: (N, dim) features of the real test items.
    """
    if not real_draws:
        raise ValueError("give at least one real draw")
    gen = gen[:, None] if gen.ndim == 2 else gen
    draws = [d[:, None] if d.ndim == 2 else d for d in real_draws]
    if any(d.shape[:2] != gen.shape[:2] for d in draws) or len(gen) < 2:
        raise ValueError(
            f"each real draw must match the generated items {tuple(gen.shape[:2])}, got "
            f"{[tuple(d.shape[:2]) for d in draws]}"
        )
    if not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples must be an integer >= 2, got {resamples!r}")
    mean, cov = test.mean(0), torch.cov(test.T)
    fd_gen = _fd(_flat(gen), mean, cov)
    floors = [_fd(_flat(d), mean, cov) for d in draws]
    picks = np.random.default_rng(seed).integers(0, len(gen), size=(resamples, len(gen)))
    fixed = FixedReference(mean, cov)
    ratios = np.array(
        [
            fixed.fd(_flat(gen[torch.as_tensor(p)])) / fixed.fd(_flat(draws[r % len(draws)][torch.as_tensor(p)]))
            for r, p in enumerate(picks)
        ]
    )
    floor = float(np.median(floors))
    tail = (1 - level) / 2 * 100
    # resampling with replacement repeats items, which lowers diversity and moves FD itself (more for the more
    # diverse side), so the bootstrap's relative spread about its median is applied to the full-set ratio
    low, high = np.percentile(ratios, [tail, 100 - tail]) / np.median(ratios) * (fd_gen / floor)
    return {
        "fd_gen_features": fd_gen,
        "fd_floor": floor,
        "fd_floor_low": float(min(floors)),
        "fd_floor_high": float(max(floors)),
        "fd_floor_draws": len(floors),
        "fd_ratio": fd_gen / floor,
        "fd_ratio_low": float(low),
        "fd_ratio_high": float(high),
    }


__all__ = ["FLOOR_DRAWS", "RATIO_RESAMPLES", "draw_rng", "matched_draw", "ratio_to_floor"]
