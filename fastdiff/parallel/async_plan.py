"""How ``parallel(mode=async)`` cuts a denoiser's layers into stages: whole layers, then a boundary layer's batch.

``Trace`` records the first call (the order layers run in, their times, whose outputs each module reads);
``Plan`` is one cut: each layer's stage, the layers shared by rows, what each stage sends. The maths are pure
functions on measured seconds per layer (no torch.distributed); async_state.py times the layers, settles the
cut over the first calls and applies it. Example::

    from fastdiff.parallel.async_plan import balanced_cuts, split_boundaries

    owner = balanced_cuts([1.0, 1.0, 3.0], 2)          # [0, 0, 1]: stages of 2 s and 3 s
    owner, split = split_boundaries([1.0, 1.0, 3.0], owner, [True] * 3)
    # split == {2: 1/6}: stage 0 also computes a sixth of layer 2's rows, both stages 2.5 s
"""

from __future__ import annotations

import dataclasses
import time

import torch

from fastdiff.core.registry import AcceleratorError
from fastdiff.core.tensors import map_tensors, tensors_of


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


def head_key(name: str) -> str:
    """Cache key of a shared unit's head rows."""
    return name + "[head rows]"


def _wait(value) -> None:
    """Wait for the CUDA kernels behind ``value`` (they run asynchronously; timing needs them finished)."""
    for t in tensors_of(value):
        if t.is_cuda:
            torch.cuda.synchronize(t.device)
            return


def timed_call(forward, args, kwargs, times: dict[str, list[float]], name: str):
    """Run ``forward``, adding its wall time to ``times[name]``."""
    _wait((args, kwargs))
    start = time.perf_counter()
    output = forward(*args, **kwargs)
    _wait(output)
    times.setdefault(name, []).append(time.perf_counter() - start)
    return output


class Trace:
    """The first call's whole steps: the order the units run in, their times, and whose outputs each reads."""

    def __init__(self):
        self.order: list[str] = []  # units in the order they ran
        self.times: dict[str, list[float]] = {}  # each unit's seconds per warm-up step
        self.reads: dict[str, set[str]] = {}  # hooked module -> units whose outputs it took as inputs
        self.splittable: set[str] = set()  # units whose inputs and outputs carry the batch first
        self.producer: dict[int, str] = {}  # id of a unit's output tensor -> unit, within one denoiser call

    def unit(self, name: str, forward, args, kwargs, batch: int | None):
        """Run and time unit ``name``, recording what it reads."""
        output = timed_call(forward, args, kwargs, self.times, name)
        self.read(name, (args, kwargs), output, batch)
        if name not in self.order:
            self.order.append(name)
        return output

    def read(self, name: str, inputs, output=None, batch: int | None = None) -> None:
        """Which units' outputs module ``name`` takes in (by tensor identity)."""
        found = {self.producer[id(t)] for t in tensors_of(inputs) if id(t) in self.producer}
        self.reads.setdefault(name, set()).update(found)
        if output is not None and carries_batch(inputs, output, batch):
            self.splittable.add(name)
        for t in tensors_of(output):
            self.producer[id(t)] = name

    def fastest(self) -> list[float]:
        """Each unit's fastest warm-up time (the first step also pays first-run costs)."""
        return [min(self.times[n]) for n in self.order]


@dataclasses.dataclass
class Plan:
    """One cut of the traced units into ``stages`` contiguous stages."""

    order: list[str]
    stages: int
    owner: dict[str, int]  # stage of each unit
    split: dict[str, tuple[int, float]]  # shared unit -> (stage computing its head rows, fraction of them)
    costs: dict[str, float]  # each unit's seconds per step that the cut was made on
    send: dict[int, list[str]]  # stage -> outputs (units, head rows) that later stages read

    @classmethod
    def cut(cls, trace: Trace, costs: list[float], stages: int, batch: int | None) -> Plan:
        """The balanced cut for per-unit ``costs``: whole units, then one unit's rows per boundary."""
        order = trace.order
        if len(order) < stages:
            raise AcceleratorError(f"parallel(mode=async): {len(order)} layers ran, fewer than stages={stages}")
        owner, split = balanced_cuts(costs, stages), {}
        if (batch or 0) > 1:
            owner, split = split_boundaries(costs, owner, [n in trace.splittable for n in order])
        shared = {order[i]: (owner[i] - 1, fraction) for i, fraction in split.items()}
        return cls.make(trace, stages, dict(zip(order, owner)), shared, dict(zip(order, costs)))

    @classmethod
    def make(cls, trace: Trace, stages: int, owner: dict, split: dict, costs: dict) -> Plan:
        """A plan for a given cut; a stage sends its last unit (it may reach the next stage through glue code,
        which is not traced), the outputs that modules holding later stages' units were traced to read, and
        its head rows of shared units."""
        plan = cls(list(trace.order), stages, dict(owner), dict(split), dict(costs), {})
        for stage in range(stages):
            names = plan.units(stage)
            wanted = {names[-1]}
            for consumer, producers in trace.reads.items():  # a block's inputs go to every unit inside it
                inside = [u for u in plan.order if u == consumer or u.startswith(consumer + ".")]
                if any(plan.owner[u] > stage for u in inside):
                    wanted |= {p for p in producers if plan.owner[p] == stage}
            plan.send[stage] = [n for n in names if n in wanted] + plan.heads(stage)
        return plan

    def units(self, stage: int) -> list[str]:
        return [n for n in self.order if self.owner[n] == stage]

    def heads(self, stage: int) -> list[str]:
        """Cache keys of the head rows that ``stage`` computes of units shared with the next stage."""
        return [head_key(n) for n, (head, _) in self.split.items() if head == stage]

    def outputs(self, stage: int) -> list[str]:
        """Every output of ``stage``, read by a later stage or not."""
        return self.units(stage) + self.heads(stage)

    def same_cut(self, other: Plan) -> bool:
        return (self.owner, self.split) == (other.owner, other.split)

    def stage_seconds(self) -> list[float]:
        """Seconds per stage at the costs the cut stands on."""
        index = {n: i for i, n in enumerate(self.order)}
        split = {index[n]: fraction for n, (_, fraction) in self.split.items()}
        return stage_seconds(
            [self.costs[n] for n in self.order], [self.owner[n] for n in self.order], split, self.stages
        )
