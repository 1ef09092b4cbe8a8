"""How ``parallel(mode=async)`` cuts a denoiser's layers into stages: whole layers, then a boundary layer's batch.

Pure functions on measured seconds per layer (no torch.distributed); async_.py times the layers and applies the
cut. Example::

    from fastdiff.parallel.async_plan import balanced_cuts, split_boundaries

    owner = balanced_cuts([1.0, 1.0, 3.0], 2)          # [0, 0, 1]: stages of 2 s and 3 s
    owner, split = split_boundaries([1.0, 1.0, 3.0], owner, [True] * 3)
    # split == {2: 1/6}: stage 0 also computes a sixth of layer 2's rows, both stages 2.5 s
"""

from __future__ import annotations

import torch

from fastdiff.core.tensors import map_tensors


def balanced_cuts(costs: list[float], stages: int) -> list[int]:
    """Stage of each unit: ``stages`` contiguous runs minimizing the costliest run (exact dynamic programme)."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: least max-stage cost of splitting units[:i] into k stages; cut[k][i]: where stage k starts
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    owner, i = [0] * n, n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        owner[j:i] = [k - 1] * (i - j)
        i = j
    return owner


def stage_seconds(costs: list[float], owner: list[int], split: dict[int, float], stages: int) -> list[float]:
    """Seconds per stage: whole layers, and a split layer's share on each side of its boundary."""
    out = [0.0] * stages
    for index, (cost, stage) in enumerate(zip(costs, owner)):
        head = split.get(index, 0.0)
        out[stage] += (1 - head) * cost
        if head:
            out[stage - 1] += head * cost
    return out


def split_boundaries(
    costs: list[float], owner: list[int], splittable: list[bool]
) -> tuple[list[int], dict[int, float]]:
    """Even out each pair of adjacent stages by sharing one boundary layer's batch between them.

    Whole layers rarely balance (one UNet layer at full resolution can be a tenth of a step). The first layer of
    stage k+1 may have its first rows computed by stage k: returns the owners (stage k's last layer may move
    over to be that layer) and ``{layer index: fraction of its rows computed by the stage before its owner}``.
    Only ``splittable`` layers (every input and output carries the batch first) are shared, each at most once.
    """
    owner, split = list(owner), {}
    stages = max(owner) + 1
    for k in range(stages - 1):
        trial = list(owner)
        first = trial.index(k + 1)
        seconds = stage_seconds(costs, trial, split, stages)
        if seconds[k] > seconds[k + 1]:  # stage k's last layer goes over, to be shared from there
            last = first - 1
            if last in split or trial.count(k) < 2:
                continue
            trial[last], first = k + 1, last
            seconds = stage_seconds(costs, trial, split, stages)
        if first in split or not splittable[first] or costs[first] <= 0:
            continue
        head = (seconds[k + 1] - seconds[k]) / (2 * costs[first])
        if 0 < head < 1:
            owner, split[first] = trial, head
    return owner, split


def head_rows(fraction: float, batch: int) -> int:
    """Rows of a shared layer that the earlier stage computes: at least one, and one fewer than the batch."""
    return min(max(round(fraction * batch), 1), batch - 1)


def rows_of(value, batch: int, start: int, stop: int | None):
    """``value`` with every tensor that carries the batch first cut to rows ``start:stop``."""
    return map_tensors(value, lambda t: t[start:stop] if t.dim() and t.shape[0] == batch else t)


def carries_batch(inputs, output, batch: int | None) -> bool:
    """Whether a layer can be shared by rows: some input and every output tensor have the batch first."""

    def batched(value, every: bool) -> bool:
        found = []
        map_tensors(value, lambda t: found.append(bool(t.dim()) and t.shape[0] == batch) or t)
        return bool(found) and (all(found) if every else any(found))

    return batch is not None and batch > 1 and batched(inputs, False) and batched(output, True)


def cat_rows(head, tail):
    """The two row ranges of one layer output joined again (same nested structure)."""
    tails: list[torch.Tensor] = []
    map_tensors(tail, lambda t: tails.append(t) or t)
    rest = iter(tails)
    return map_tensors(head, lambda t: torch.cat([t, next(rest)]))
