"""Per-guidance-branch state for caching hooks, keyed by the step context's branches.

A batched classifier-free-guidance call runs the denoiser on ``len(ctx.branches)`` equal chunks, one per branch
(``("uncond", "cond")``); a callback may turn guidance off mid-call (``("cond",)``). Caches keep what they store
per branch, so a later evaluation with another branch layout still finds each branch's own values. diffusers keys
its hook state by cache context the same way (``StateManager``); this keys it by branch within one call.

Example::

    import torch
    from fastdiff.core.branch_state import BranchState

    state = BranchState()
    state.store("tail").put(("uncond", "cond"), 0, torch.arange(4.0).reshape(4, 1))
    state.store("tail").get(("cond",))  # tensor([[2.], [3.]])
    state.clear()  # at the start of every call
"""

from __future__ import annotations

import torch

Value = torch.Tensor | list[torch.Tensor]  # a batch-first tensor, or a list of them (a module's outputs)


def _chunk(value: Value, index: int, parts: int) -> Value:
    """Chunk ``index`` of ``parts`` equal chunks of a batch (a view)."""

    def piece(t: torch.Tensor) -> torch.Tensor:
        size = t.shape[0] // parts
        return t[index * size : (index + 1) * size]

    return piece(value) if isinstance(value, torch.Tensor) else [piece(t) for t in value]


def _batch(value: Value) -> int:
    return (value if isinstance(value, torch.Tensor) else value[0]).shape[0]


# A stored point: (step, whole batch, index of the branch's chunk in it, number of chunks). The chunk is sliced only
# when read (most reads take the whole batch back); plain tuples because this runs on every step (host time).
Point = tuple[int, Value, int, int]


def _value(point: Point) -> Value:
    _, whole, index, parts = point
    return whole if parts == 1 else _chunk(whole, index, parts)


class BranchStore:
    """Values stored per guidance branch, each with the step it was made at; the last ``keep`` per branch.

    ``put`` stores a batch of its branches' chunks; ``get`` joins the latest chunks of the branches asked for, in
    that order (no copy when they are the last ``put``'s whole batch); ``points`` is one branch's history, oldest
    first."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self._points: dict[str, list[Point]] = {}
        self._whole: tuple[tuple[str, ...], int, Value] | None = None

    def put(
        self, branches: tuple[str, ...], step: int, value: Value, since: int | None = None, copy: bool = False
    ) -> None:
        """Store ``value`` (its batch holds ``branches`` in order) at ``step``, replacing a value of the same or a
        later step (a repeated call) and dropping points older than ``since``; ``copy``: keep a detached copy."""
        if copy:
            value = value.detach().clone() if isinstance(value, torch.Tensor) else [t.detach().clone() for t in value]
        self._whole = (branches, step, value)
        parts = len(branches)
        for index, branch in enumerate(branches):
            point = (step, value, index, parts)
            if self.keep == 1:  # the new point is the whole history
                self._points[branch] = [point]
                continue
            kept = [p for p in self._points.get(branch, ()) if p[0] < step and (since is None or p[0] >= since)]
            kept.append(point)
            self._points[branch] = kept[-self.keep :]

    def has(self, branches: tuple[str, ...], since: int = 0, chunk: int | None = None) -> bool:
        """Every branch has a value from step ``since`` on (with ``chunk`` images, if given)."""
        for branch in branches:
            points = self._points.get(branch)
            if not points:
                return False
            step, whole, _, parts = points[-1]
            if step < since or (chunk is not None and _batch(whole) // parts != chunk):
                return False
        return True

    def get(self, branches: tuple[str, ...]) -> Value:
        """The latest values of ``branches``, joined along the batch in that order."""
        if self._whole is not None and self._whole[0] == branches:
            return self._whole[2]
        latest = [_value(self._points[b][-1]) for b in branches]
        tensors = [v for v in latest if isinstance(v, torch.Tensor)]
        if len(tensors) == len(latest):
            return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        return [torch.cat(parts) for parts in zip(*latest)]

    def points(self, branch: str) -> list[tuple[int, Value]]:
        return [(point[0], _value(point)) for point in self._points.get(branch, [])]

    def joined_points(self, branches: tuple[str, ...]) -> list[tuple[int, Value]] | None:
        """The history of ``branches`` as whole batches, when each point of every branch is its chunk of the same
        stored batch (steps alike, branches in this order): work on them is one operation per point instead of one
        per branch and point. None otherwise."""
        first = self._points.get(branches[0])
        if not first:
            return None
        parts = len(branches)
        for index, branch in enumerate(branches):
            points = self._points.get(branch)
            if points is None or len(points) != len(first):
                return None
            for (step, whole, at, count), (step0, whole0, _, _) in zip(points, first):
                if step != step0 or whole is not whole0 or at != index or count != parts:
                    return None
        return [(point[0], point[1]) for point in first]


class BranchState:
    """A hook's per-branch stores by name, cleared together at the start of every call; ``values`` holds small
    per-branch facts (a step, a running sum) beside them."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self.stores: dict[str, BranchStore] = {}
        self.values: dict[tuple[str, str], object] = {}  # (name, branch) -> value

    def store(self, name: str) -> BranchStore:
        found = self.stores.get(name)  # not setdefault: that builds a store on every read (host time per step)
        if found is None:
            found = self.stores[name] = BranchStore(self.keep)
        return found

    def value(self, name: str, branch: str, default=None):
        return self.values.get((name, branch), default)

    def set(self, name: str, branches: tuple[str, ...], value) -> None:
        self.values.update(((name, b), value) for b in branches)

    def clear(self) -> None:
        self.stores, self.values = {}, {}
