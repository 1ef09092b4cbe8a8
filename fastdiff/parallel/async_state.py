"""The state that ``parallel(mode=async)``'s hooks share on one rank: the stage plan, each layer's latest output,
the exchanges between ranks and where the current call stands (the hooks and the overview are in async_.py).
"""

from __future__ import annotations

import itertools
import statistics
import time

import torch
import torch.distributed as dist

from fastdiff.core.registry import AcceleratorError
from fastdiff.core.tensors import map_tensors
from fastdiff.parallel.async_plan import (
    balanced_cuts,
    carries_batch,
    head_rows,
    rows_of,
    split_boundaries,
    stage_seconds,
)

MAX_RECUTS = 3  # re-cuts on staged timings before the cut is kept
BALANCED = 0.05  # stages whose measured times differ by less than this fraction are left as they are


def head_key(name: str) -> str:
    """Cache key of a shared unit's head rows."""
    return name + "[head rows]"


def _tensors(value) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(value, lambda t: found.append(t) or t)
    return found


def _wait(value) -> None:
    """Wait for the CUDA kernels behind ``value`` (they run asynchronously; timing needs them finished)."""
    for t in _tensors(value):
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


class AsyncState:
    """What the hooks share: the stage plan, the latest output of every unit, and where this call stands."""

    def __init__(self, context, stages: int, stage: int, ranks: list[int], group, warmup: int, stride: int,
                 cooldown: int = 0, extrapolate: int = 0):  # fmt: skip
        self.context, self.stages, self.stage, self.ranks, self.group = context, stages, stage, ranks, group
        self.warmup, self.stride, self.cooldown, self.extrapolate = warmup, stride, cooldown, extrapolate
        self.order: list[str] = []  # units in the order they ran at the first call
        self.warmup_times: dict[str, list[float]] = {}  # each unit's times over the first call's warm-up
        self.costs: dict[str, float] = {}  # each unit's seconds per step that the current cut was made on
        self.owner: dict[str, int] | None = None  # stage of each unit, fixed once the first warm-up ends
        self.cache: dict[str, object] = {}  # each unit's latest output known on this rank
        self.call, self.index, self.batch = -1, 0, None
        self.sequential = True  # the current denoiser call runs whole on every rank
        self.fresh = True  # every rank holds every unit's output of the previous call (it ran whole)
        # id of a unit's output tensor -> unit (first call, to trace reads)
        self.producer: dict[int, str] = {}
        self.reads: dict[str, set[str]] = {}  # hooked module -> units whose outputs it took as inputs
        self.send: dict[int, list[str]] = {}  # stage -> its units whose outputs later stages read
        self.selective = True  # False: exchange every output of a stage (tests compare the two)
        self.known: dict[str, list] = {}  # extrapolate: unit -> its last two (timestep, output), newest last
        self.buffers: dict[tuple[str, int], torch.Tensor] = {}  # extrapolate: where the views are written
        self.view: dict[str, object] = {}  # extrapolate: earlier stages' outputs as this stage reads them
        self.last_timestep: float | None = None  # of the previous denoiser call of this call
        self.replan = True  # False keeps the cut made on the warm-up timings
        self.tuning = True  # own layers are timed in the staged steps; the cut may still change
        self.recuts: list[dict[str, int]] = []  # the cuts made on staged timings, in order
        self.staged_times: dict[str, list[float]] = {}  # own layers' times in the current call's staged steps
        self.staged_call = -1  # the call that ``staged_times`` were taken in
        self.splittable: set[str] = set()  # units whose inputs and outputs carry the batch first
        # shared unit -> (stage computing its head rows, fraction of them)
        self.split: dict[str, tuple[int, float]] = {}
        self.fractional = True  # False: whole layers only (tests compare the two)
        # two stages: stage 0 posts each output as soon as it is computed, stage 1 receives it while it computes
        # (more stages would need a process group per sending stage to keep the collectives in one order)
        self.overlap = stages == 2
        self.post_now = False  # this staged step's outputs go out during it (the next step exchanges)
        self.posted: list[
            tuple[str, list[tuple[object, torch.Tensor]]]
        ] = []  # (unit, [(work, flat)]) in order

    def stage_costs(self) -> list[float]:
        """Measured seconds per stage (the timings of the current cut)."""
        if self.owner is None:
            return [0.0] * self.stages
        index = {n: i for i, n in enumerate(self.order)}
        split = {index[n]: fraction for n, (_, fraction) in self.split.items()}
        return stage_seconds([self.costs[n] for n in self.order], [self.owner[n] for n in self.order], split,
                             self.stages)  # fmt: skip

    def rows(self, name: str) -> int:
        """Head rows of shared unit ``name`` at this call's batch."""
        return head_rows(self.split[name][1], self.batch)

    def begin(self, batch: int | None) -> None:
        ctx = self.context
        if ctx.call_index != self.call:
            self.call, self.index, self.fresh = ctx.call_index, 0, True
            self.known.clear()
            self.view.clear()
        self.producer.clear()  # tensor ids are traced within one denoiser call
        cooling = self.cooldown and ctx.num_steps and ctx.step >= ctx.num_steps - self.cooldown
        self.sequential = self.index < self.warmup or batch != self.batch or bool(cooling)
        self.sequential |= bool(self.split) and (batch or 0) < 2  # no rows to share
        self.batch = batch
        if not self.sequential and self.owner is None:
            self._plan()
        elif not self.sequential and self.tuning and self.call > self.staged_call >= 0:
            self._replan()  # a later call's first staged step: every rank holds fresh outputs
        if self.overlap:
            self._collect(install=not self.sequential)
            self.post_now = not self.sequential and (self.index + 1 - self.warmup) % self.stride == 0
            if self.post_now and self.stage != 0:
                for name in self._exchanged(0):
                    self._post(name)
        elif not self.sequential and not self.fresh and (self.index - self.warmup) % self.stride == 0:
            self._exchange()
        if not self.sequential and self.extrapolate:
            self._extrapolate()
        self.index += 1

    def end(self) -> None:
        self.fresh = self.sequential
        if self.sequential and self.extrapolate:
            for name, output in self.cache.items():
                self._remember(name, self.context.timestep, output)
        self.last_timestep = self.context.timestep

    def _remember(self, name: str, timestep: float | None, output) -> None:
        history = self.known.setdefault(name, [])
        if not history or history[-1][1] is not output:
            history.append((timestep, output))
            del history[:-2]

    def _extrapolate(self) -> None:
        """Earlier stages' outputs (computed at the previous call) carried on linearly to this call's timestep,
        into buffers kept from call to call (fresh 100 MB allocations per step cost more than the arithmetic)."""
        now = self.context.timestep
        for name in (n for stage in range(self.stage) for n in self._exchanged(stage)):
            self._remember(name, self.last_timestep, self.cache[name])
            history = self.known[name]
            (t0, older), (t1, newer) = history if len(history) == 2 else (history[0], history[0])
            if None in (now, t0, t1) or t0 == t1:
                self.view.pop(name, None)
                continue
            ratio, olds, index = (now - t1) / (t1 - t0), iter(_tensors(older)), itertools.count()

            def carry(t, name=name, ratio=ratio, olds=olds, index=index):
                key = (name, next(index))
                out = self.buffers.get(key)
                if out is None or out.shape != t.shape or out.dtype != t.dtype or out.device != t.device:
                    out = self.buffers[key] = torch.empty_like(t)
                return torch.lerp(t, next(olds), -ratio, out=out)

            self.view[name] = map_tensors(newer, carry)

    def _exchanged(self, stage: int) -> list[str]:
        """The units of ``stage`` whose outputs go to the later stages at each exchange."""
        if self.selective:
            return self.send[stage]
        return [n for n in self.order if self.owner[n] == stage] + self._heads(stage)

    @property
    def settled(self) -> bool:
        """Whether the cut is made and kept (no more timing or re-cutting)."""
        return self.owner is not None and not self.tuning

    def _plan(self) -> None:
        fastest = [min(self.warmup_times[n]) for n in self.order]  # the first step also pays first-run costs
        costs = torch.tensor(fastest, dtype=torch.float64)
        self._collective(dist.broadcast, costs, src=self.ranks[0])  # one timing for all: identical cuts
        self._cut(costs)
        self.tuning = self.replan

    def _replan(self) -> None:
        """Cut again on the previous call's staged timings: each layer timed by its owner while the stages ran
        at once (whole-model timings misjudge layers: a digits cut on them once left rank 0 twice the work;
        and a stage timed while its peer idled looks cheaper than it is once both compute, hence the rounds)."""
        medians = [
            statistics.median(self.staged_times[n]) if n in self.staged_times else 0.0 for n in self.order
        ]
        costs = torch.tensor(medians, dtype=torch.float64)
        self._collective(dist.all_reduce, costs)  # every layer was timed on exactly one rank of the group
        self.staged_times.clear()
        if not bool((costs > 0).all()):  # a layer did not run in the staged steps: nothing to judge it by
            self.tuning = False
            return
        measured = torch.zeros(self.stages, dtype=torch.float64)  # each stage's own layers, by its own rank
        measured[self.stage] = sum(medians)
        self._collective(dist.all_reduce, measured)
        plan = self._plan_for(costs.tolist())
        if max(measured) <= (1 + BALANCED) * min(measured) or plan == (self.owner, self.split):
            self.costs = dict(zip(self.order, costs.tolist()))  # the timings the kept cut stands on
            self.tuning = False
            return
        self._cut(costs)
        self.recuts.append(dict(self.owner))
        self.tuning = len(self.recuts) < MAX_RECUTS

    def _cut(self, costs: torch.Tensor) -> None:
        if len(self.order) < self.stages:
            raise AcceleratorError(f"parallel(mode=async): {len(self.order)} layers ran, fewer than "
                                   f"stages={self.stages}")  # fmt: skip
        self.costs = dict(zip(self.order, costs.tolist()))
        self.set_cut(*self._plan_for(costs.tolist()))

    def _plan_for(self, costs: list[float]) -> tuple[dict[str, int], dict[str, tuple[int, float]]]:
        """Owners and shared units for per-unit ``costs`` (whole units, then one unit's rows per boundary)."""
        owner, split = balanced_cuts(costs, self.stages), {}
        if self.fractional and (self.batch or 0) > 1:
            owner, split = split_boundaries(costs, owner, [n in self.splittable for n in self.order])
        owners = dict(zip(self.order, owner))
        return owners, {self.order[i]: (owner[i] - 1, fraction) for i, fraction in split.items()}

    def set_cut(self, owner: dict[str, int], split: dict[str, tuple[int, float]]) -> None:
        """Use this cut from the next staged step on; only between calls or at a call's first staged step."""
        self.owner, self.split = dict(owner), dict(split)
        self.send.clear()
        for stage in range(self.stages):
            names = [n for n in self.order if self.owner[n] == stage]
            wanted = {names[-1]}  # the boundary: it may reach the next stage through glue code (no tracing)
            for consumer, producers in self.reads.items():  # a block's inputs go to every unit inside it
                inside = [u for u in self.order if u == consumer or u.startswith(consumer + ".")]
                if any(self.owner[u] > stage for u in inside):
                    wanted |= {p for p in producers if self.owner[p] == stage}
            self.send[stage] = [n for n in names if n in wanted] + self._heads(stage)
        for name in self.split:  # the head rows as of the last whole steps (every rank ran every unit)
            history, rows = self.known.get(name, []), self.rows(name)
            self.known[head_key(name)] = [(t, rows_of(out, self.batch, 0, rows)) for t, out in history]
            if (
                history and history[-1][1] is self.cache[name]
            ):  # the same object: extrapolated from, not re-added
                self.cache[head_key(name)] = self.known[head_key(name)][-1][1]
            else:
                self.cache[head_key(name)] = rows_of(self.cache[name], self.batch, 0, rows)
        self.producer.clear()

    def _heads(self, stage: int) -> list[str]:
        """Cache keys of the head rows that ``stage`` computes of units shared with the next stage."""
        return [head_key(n) for n, (head, _) in self.split.items() if head == stage]

    def trace(self, name: str, inputs, output=None) -> None:
        """First call: which units' outputs each hooked module takes in (by tensor identity)."""
        if self.owner is not None or not self.sequential:
            return
        found = {self.producer[id(t)] for t in _tensors(inputs) if id(t) in self.producer}
        self.reads.setdefault(name, set()).update(found)
        if output is not None and carries_batch(inputs, output, self.batch):
            self.splittable.add(name)
        for t in _tensors(output):
            self.producer[id(t)] = name

    def _exchange(self) -> None:
        """Every stage's latest outputs to every rank: one broadcast per stage (and dtype). The last stage's
        are left out: they feed nothing but its own prediction, which ``share_prediction`` sends."""
        for stage, src in enumerate(self.ranks[:-1]):
            names = self._exchanged(stage)
            tensors = [t for n in names for t in _tensors(self.cache[n])]
            received: list[torch.Tensor] = []
            for dtype in sorted({t.dtype for t in tensors}, key=str):
                mine = [t for t in tensors if t.dtype == dtype]
                if stage == self.stage:
                    flat = torch.cat([t.reshape(-1) for t in mine])
                else:
                    flat = torch.empty(sum(t.numel() for t in mine), dtype=dtype, device=mine[0].device)
                self._collective(dist.broadcast, flat, src=src)
                parts = iter(flat.split([t.numel() for t in mine]))
                received += [(t, next(parts).view(t.shape)) for t in mine]
            if stage != self.stage:
                new = {id(t): r for t, r in received}
                for n in names:
                    self.cache[n] = map_tensors(self.cache[n], lambda t, new=new: new[id(t)])

    def computed(self, name: str | None) -> None:
        """On stage 0, in a staged step: post the outputs to send, in order, up to ``name`` (None: all the rest;
        one that did not run this step goes from the cache, so that both ranks post the same broadcasts)."""
        if not (self.overlap and self.post_now and self.stage == 0):
            return
        names = self._exchanged(0)
        if name is not None and name not in names:
            return
        upto = len(names) if name is None else names.index(name) + 1
        for pending in names[len(self.posted) : upto]:
            self._post(pending)

    def _post(self, name: str) -> None:
        """Start the broadcast of one unit's output from stage 0 (per dtype; stage 1 posts the receive)."""
        tensors, works = _tensors(self.cache[name]), []
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            mine = [t for t in tensors if t.dtype == dtype]
            if self.stage == 0:  # a copy: glue code may change the output in place while it is sent
                flat = torch.cat([t.reshape(-1) for t in mine])
            else:
                flat = torch.empty(sum(t.numel() for t in mine), dtype=dtype, device=mine[0].device)
            try:
                works.append((dist.broadcast(flat, src=self.ranks[0], group=self.group, async_op=True), flat))
            except RuntimeError as error:
                self._lost(error)
        self.posted.append((name, works))

    def _collect(self, install: bool) -> None:
        """Wait for the broadcasts posted during the previous step; on stage 1 take in what arrived."""
        for name, works in self.posted:
            received = []
            for work, flat in works:
                try:
                    work.wait()
                except RuntimeError as error:
                    self._lost(error)
                received.append(flat)
            if install and self.stage != 0:
                tensors = _tensors(self.cache[name])
                new = {}
                for flat, dtype in zip(received, sorted({t.dtype for t in tensors}, key=str)):
                    mine = [t for t in tensors if t.dtype == dtype]
                    new.update(
                        (id(t), part.view(t.shape))
                        for t, part in zip(mine, flat.split([t.numel() for t in mine]))
                    )
                self.cache[name] = map_tensors(self.cache[name], lambda t, new=new: new[id(t)])
        self.posted.clear()

    def share_prediction(self, output):
        """The last stage's prediction, on every rank."""

        def from_last(t: torch.Tensor) -> torch.Tensor:
            t = t.contiguous()
            self._collective(dist.broadcast, t, src=self.ranks[-1])
            return t

        return map_tensors(output, from_last)

    def _collective(self, op, tensor, **kwargs) -> None:
        try:
            op(tensor, group=self.group, **kwargs)
        except RuntimeError as error:  # gloo: a peer died (connection closed) or hung (timeout)
            self._lost(error)

    def _lost(self, error: RuntimeError):
        raise RuntimeError(f"parallel(mode=async): rank {dist.get_rank()} lost its peers at step "
                           f"{self.context.step}: {error}") from error  # fmt: skip
