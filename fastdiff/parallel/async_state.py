"""What ``parallel(mode=async)``'s hooks share on one rank (the hooks and the overview are in async_.py).

``AsyncState`` steps through a call: warm-up steps run whole (the first call's are traced, async_plan.Trace),
then the first cut (async_plan.Plan) is made on the warm-up timings; ``Settling`` re-cuts it on staged timings
over the next calls until it is kept; an exchange strategy (async_exchange.py) moves the outputs between the
stages; ``Extrapolation`` carries them on to the current timestep (``extrapolate=1``). The per-call part is
cleared by ``reset`` (diffusers' stateful-hook reset at the start of every call); trace, plan, settling and
the outputs stay.
"""

from __future__ import annotations

import itertools
import statistics

import torch
import torch.distributed as dist

from fastdiff.core.tensors import map_tensors, tensors_of
from fastdiff.parallel.async_exchange import BlockingExchange, Exchange, OverlappedExchange
from fastdiff.parallel.async_plan import Plan, Trace, head_key, head_rows, rows_of, timed_call
from fastdiff.parallel.group import FlatBroadcast, peers

MAX_RECUTS = 3  # re-cuts on staged timings before the cut is kept
BALANCED = 0.05  # stages whose measured times differ by less than this fraction are left as they are


class Settling:
    """The re-cut rounds after the first cut. While active, each rank times its own units in the staged steps;
    at a later call's first staged step the units are cut again on those timings (each unit timed by its owner
    while the stages ran at once: whole-model timings misjudge layers, and a stage timed while its peer idled
    looks cheaper than it is once both compute, hence the rounds), until the stages are within ``BALANCED`` of
    each other, the cut stops changing, or ``MAX_RECUTS`` re-cuts were made."""

    def __init__(self, active: bool = True):
        self.active = active  # own units are timed in staged steps; the cut may still change
        self.times: dict[str, list[float]] = {}  # own units' seconds in the staged steps since the last cut
        self.due = False  # timings of an earlier call wait to be judged
        self.recuts: list[dict[str, int]] = []  # the cuts made on staged timings, in order

    def call_ended(self) -> None:
        self.due = self.active and bool(self.times)

    def run(self, forward, args, kwargs, name: str):
        """This rank's part of a staged step, timed while the cut may change."""
        if not self.active:
            return forward(*args, **kwargs)
        return timed_call(forward, args, kwargs, self.times, name)

    def judge(self, st: AsyncState) -> Plan | None:
        """A new cut for ``st`` to use, or None (the current one kept; its costs brought up to date)."""
        plan, self.due = st.plan, False
        medians = [statistics.median(self.times[n]) if n in self.times else 0.0 for n in plan.order]
        costs = torch.tensor(medians, dtype=torch.float64)
        st.all_reduce(costs)  # every unit was timed on exactly one rank of the group
        self.times.clear()
        if not bool((costs > 0).all()):  # a unit did not run in the staged steps: nothing to judge it by
            self.active = False
            return None
        measured = torch.zeros(st.stages, dtype=torch.float64)  # each stage's own units, by its own rank
        measured[st.stage] = sum(medians)
        st.all_reduce(measured)
        new = Plan.cut(st.trace, costs.tolist(), st.stages, st.batch)
        if max(measured) <= (1 + BALANCED) * min(measured) or new.same_cut(plan):
            plan.costs = dict(zip(plan.order, costs.tolist()))  # the timings the kept cut stands on
            self.active = False
            return None
        self.recuts.append(dict(new.owner))
        self.active = len(self.recuts) < MAX_RECUTS
        return new


class Extrapolation:
    """``extrapolate=1``: earlier stages' outputs (computed at the previous denoiser call) carried on linearly to
    this call's timestep from the last two received, into buffers kept from call to call (fresh 100 MB
    allocations per step cost more than the arithmetic)."""

    def __init__(self):
        self.known: dict[str, list] = {}  # unit -> its last two (timestep, output) this call, newest last
        self.view: dict[str, object] = {}  # the carried outputs, as this stage reads them
        self.buffers: dict[tuple[str, int], torch.Tensor] = {}

    def reset(self) -> None:
        self.known.clear()
        self.view.clear()

    def remember(self, name: str, timestep: float | None, output) -> None:
        history = self.known.setdefault(name, [])
        if not history or history[-1][1] is not output:
            history.append((timestep, output))
            del history[:-2]

    def carry(self, names: list[str], cache: dict, last: float | None, now: float | None) -> None:
        for name in names:
            self.remember(name, last, cache[name])
            history = self.known[name]
            (t0, older), (t1, newer) = history if len(history) == 2 else (history[0], history[0])
            if None in (now, t0, t1) or t0 == t1:
                self.view.pop(name, None)
                continue
            ratio, olds, index = (now - t1) / (t1 - t0), iter(tensors_of(older)), itertools.count()

            def carry(t, name=name, ratio=ratio, olds=olds, index=index):
                key = (name, next(index))
                out = self.buffers.get(key)
                if out is None or out.shape != t.shape or out.dtype != t.dtype or out.device != t.device:
                    out = self.buffers[key] = torch.empty_like(t)
                return torch.lerp(t, next(olds), -ratio, out=out)

            self.view[name] = map_tensors(newer, carry)


class AsyncState:
    """One rank's stage plan, the latest output of every unit it knows, and where the current call stands."""

    def __init__(self, context, config, stage: int, ranks: list[int], group):
        self.context, self.stage, self.ranks, self.group = context, stage, ranks, group
        self.stages, self.warmup, self.stride = config.stage_count(), config.warmup, config.stride
        self.cooldown, self.extrapolate = config.cooldown, config.extrapolate
        self.by_time = config.balance == "time"  # else: equal layer counts, cut once and never re-cut
        self.trace, self.plan, self.settling = Trace(), None, Settling(active=self.by_time)
        self.exchange: Exchange = OverlappedExchange() if self.stages == 2 else BlockingExchange()
        self.extra = Extrapolation()
        self.cache: dict[str, object] = {}  # each unit's latest output known on this rank
        self.batch: int | None = None  # of the previous denoiser call
        self.sequential = True  # the current denoiser call runs whole on every rank
        self.reset()

    def reset(self) -> None:
        """A call starts (or ends): the per-call part cleared."""
        self.index = 0  # denoiser calls so far in this call
        self.fresh = True  # every rank holds every unit's output of the previous denoiser call (it ran whole)
        self.last_timestep: float | None = None  # of the previous denoiser call of this call
        self.extra.reset()
        self.settling.call_ended()

    @property
    def settled(self) -> bool:
        """Whether the cut is made and kept (no more timing or re-cutting)."""
        return self.plan is not None and not self.settling.active

    def rows(self, name: str) -> int:
        """Head rows of shared unit ``name`` at this call's batch."""
        return head_rows(self.plan.split[name][1], self.batch)

    def latest(self, name: str):
        """The output of unit ``name`` as this rank reads it (carried on to the timestep with extrapolate=1)."""
        return self.extra.view.get(name, self.cache[name]) if self.extrapolate else self.cache[name]

    def begin(self, batch: int | None) -> None:
        ctx = self.context
        self.trace.producer.clear()  # tensor ids are traced within one denoiser call
        cooling = self.cooldown and ctx.num_steps and ctx.step >= ctx.num_steps - self.cooldown
        self.sequential = self.index < self.warmup or batch != self.batch or bool(cooling)
        self.sequential |= bool(self.plan and self.plan.split) and (batch or 0) < 2  # no rows to share
        self.batch = batch
        if not self.sequential and self.plan is None:
            fastest = self.trace.fastest() if self.by_time else [1.0] * len(self.trace.order)
            costs = torch.tensor(fastest, dtype=torch.float64)
            with peers("parallel(mode=async)", ctx):  # one timing for all: identical cuts
                dist.broadcast(costs, src=self.ranks[0], group=self.group)
            self.use(Plan.cut(self.trace, costs.tolist(), self.stages, batch))
        elif not self.sequential and self.settling.due:  # a later call's first staged step
            new = self.settling.judge(self)
            if new is not None:
                self.use(new)
        self.exchange.begin(self)
        if not self.sequential and self.extrapolate:
            earlier = [n for stage in range(self.stage) for n in self.exchange.names(self.plan, stage)]
            self.extra.carry(earlier, self.cache, self.last_timestep, ctx.timestep)
        self.index += 1

    def end(self) -> None:
        self.fresh = self.sequential
        if self.sequential and self.extrapolate:
            for name, output in self.cache.items():
                self.extra.remember(name, self.context.timestep, output)
        self.last_timestep = self.context.timestep

    def use(self, plan: Plan) -> None:
        """Use ``plan`` from the next staged step on; only between calls or at a call's first staged step."""
        self.plan = plan
        for name in plan.split:  # the head rows as of the last whole steps (every rank ran every unit)
            history, rows, head = self.extra.known.get(name, []), self.rows(name), head_key(name)
            self.extra.known[head] = [(t, rows_of(out, self.batch, 0, rows)) for t, out in history]
            if history and history[-1][1] is self.cache[name]:  # the same object: extrapolated from, not re-added
                self.cache[head] = self.extra.known[head][-1][1]
            else:
                self.cache[head] = rows_of(self.cache[name], self.batch, 0, rows)

    def set_cut(self, owner: dict[str, int], split: dict[str, tuple[int, float]]) -> None:
        """Use this cut (each unit's stage, shared units) from the next staged step on (tests)."""
        self.use(Plan.make(self.trace, self.stages, owner, split, self.plan.costs if self.plan else {}))

    def set_exchange(self, exchange: Exchange) -> None:
        """Exchange the outputs this way from the next call on (between calls)."""
        self.exchange.drain(self)
        self.exchange = exchange

    def computed(self, name: str | None) -> None:
        """Unit ``name`` has just been computed in a staged step (None: the step's units are done)."""
        self.exchange.computed(self, name)

    def share_prediction(self, output):
        """The last stage's prediction, on every rank."""
        with peers("parallel(mode=async)", self.context):
            return FlatBroadcast(output, self.ranks[-1], self.group).received()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        with peers("parallel(mode=async)", self.context):
            dist.all_reduce(tensor, group=self.group)
