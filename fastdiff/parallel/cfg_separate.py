"""``parallel(mode=cfg)`` on pipelines that run guidance as separate denoiser calls (Wan, HunyuanVideo, Flux's and
Qwen-Image's true CFG, Flux.2 Klein): each rank runs one branch's call at once.

Such a pipeline calls the denoiser with the cond inputs, then with the uncond ones, so the second call's inputs
are not known when the first starts. They differ from the first call's only in what stays fixed over a call (the
negative prompt's embeddings and ids), so from the second step on, at the first call, rank r runs branch r on the
first call's inputs with the entries in which the previous step's calls differed swapped in; the outputs are
all-gathered, and the second call returns the uncond output without running. Every branch is computed on exactly
the inputs the pipeline gives it (the second call's inputs are checked against the prediction, and a mismatch
fails the call), so the output equals one process's. The first step runs both calls on every rank.
"""

from __future__ import annotations

import torch

from fastdiff.core.diffusers_compat import StatefulHook
from fastdiff.core.registry import AcceleratorError
from fastdiff.core.tensors import tensors_of, with_tensors
from fastdiff.parallel.group import gather


def same(a, b) -> bool:
    """Whether two call inputs are equal: the same object, equal tensors, or equal nested values."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (objects without a usable equality are not the same)
        return False


def entries(args: tuple, kwargs: dict) -> dict:
    """A call's inputs by position (0, 1, ...) and keyword."""
    return {**dict(enumerate(args)), **kwargs}


class SeparateBranchHook(StatefulHook):
    """On the denoiser: this rank's branch at a step's first call, the other branches from its peers."""

    def __init__(self, context, world: int, rank: int, group=None):
        super().__init__()
        self.context, self.world, self.rank, self.group = context, world, rank, group
        self.reset_state(None)

    def reset_state(self, module):
        self.swapped: dict = {}  # entries in which the previous step's later calls differed from its first
        self.first: dict | None = None  # this step's first call's inputs
        self.ready: list = []  # outputs of this step's later calls, computed by their ranks
        return module

    def new_forward(self, module, *args, **kwargs):
        ctx, forward = self.context, self.fn_ref.original_forward
        k = ctx.step_calls - 1  # this call's place in its step (the context hook counted it)
        if not ctx.separate_cfg or k >= self.world:
            return forward(*args, **kwargs)
        now = entries(args, kwargs)
        if k == 0:
            self.first, self.ready = now, []
            if len(self.swapped) < self.world - 1:  # the first step: every call runs whole on every rank
                return forward(*args, **kwargs)
            mine = now if self.rank == 0 else {**now, **self.swapped[self.rank]}
            output = forward(*[mine[i] for i in range(len(args))], **{n: mine[n] for n in kwargs})
            outputs = self._gather(output)
            self.ready = outputs[1:]
            return outputs[0]
        if not self.ready:  # the first step: note what differs, run whole
            self.swapped[k] = {n: v for n, v in now.items() if not same(v, self.first.get(n, _MISSING))}
            return forward(*args, **kwargs)
        expected = {**self.first, **self.swapped[k]}
        changed = [str(n) for n in now.keys() | expected.keys() if not same(now.get(n, _MISSING), expected.get(n))]
        if changed:
            raise AcceleratorError(
                f"parallel(mode=cfg): the {ctx.branches[0]} call of step {ctx.step} got other inputs than the "
                f"previous step's calls predicted ({', '.join(sorted(changed))} changed); this pipeline's "
                "separate guidance calls cannot be run ahead on another rank"
            )
        return self.ready[k - 1]

    def _gather(self, output) -> list:
        """Every rank's output of this call, in rank order."""
        gathered = [gather(t, self.world, self.group, self.context) for t in tensors_of(output)]
        return [with_tensors(output, [parts[r] for parts in gathered]) for r in range(self.world)]


_MISSING = object()
