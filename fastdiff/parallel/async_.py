"""``parallel(mode=async)``: AsyncDiff (Chen et al. 2024), the denoiser split into stages run at once on N ranks.

The denoiser's layers (``stage_units`` in fastdiff/core/models.py: UNet resnets/attentions/samplers, DiT blocks)
get a named hook each. The first ``warmup`` denoiser calls of a call run the whole model on every rank; the
first of them also records the order the layers run in and times each one. Then the layers are cut into
``stages`` contiguous stages of about equal measured cost (rank 0's timings, broadcast so that every rank
cuts alike), stage k on rank k. From then on, at every denoiser call each rank computes only its own stage;
every other layer returns the output its owner produced at the previous call, exchanged at the start of the
call (one broadcast per stage but the last), so stage k consumes stage k-1's output from the previous step and
all stages compute at once. At the second call the layers are cut once more, on their timings from the first
call's staged steps (each timed by its owner while all stages ran), and that cut is kept. UNet skip features come along the same way (they are layer outputs). The last
stage's prediction is broadcast to every rank, so the sampler state stays identical everywhere.

``stride=s`` exchanges the activations only every s-th call (stages keep consuming the same, older ones in
between); AsyncDiff's own stride, which computes two steps per round on an extra device, is not built.
``extrapolate=1`` hands a stage its inputs extrapolated to the current timestep from the last two it received
(linear in the timestep, as the ``forecast`` accelerator does for whole predictions) instead of the stale ones.

A call whose denoiser batch differs from the previous call's (guidance switched off by a callback) runs whole
on every rank, like a warm-up call. Collectives fail after the process group's timeout when a peer dies or
hangs; the error names the rank and the step.

Example (``torchrun --nproc-per-node 2 script.py``)::

    import torch.distributed as dist
    from fastdiff import FastPipeline

    dist.init_process_group("gloo")
    fp = FastPipeline.from_pretrained("/tmp/tiny-sd", accelerators="parallel(mode=async,devices=2)")
    images = fp(prompt="a red fox", output_type="np").images   # the same on every rank
"""

from __future__ import annotations

import fnmatch
import itertools
import time

import torch
import torch.distributed as dist
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import HandleGroup, install_hook
from fastdiff.core.models import UnsupportedModelError, denoiser_facts
from fastdiff.core.registry import AcceleratorError
from fastdiff.core.tensors import batch_size_of, map_tensors

HOOK_NAME = "fastdiff.parallel-async"


def stage_units(denoiser) -> dict[str, torch.nn.Module]:
    """The denoiser's modules matching its ``stage_units`` patterns (models.py), by dotted name."""
    facts = denoiser_facts(denoiser, "parallel(mode=async)")
    if not facts.stage_units:
        raise UnsupportedModelError(f"parallel(mode=async) has no stage layout for {type(denoiser).__name__}")
    patterns = [p.split(".") for p in facts.stage_units]
    units = {}
    for name, module in denoiser.named_modules():
        parts = name.split(".")
        if any(len(p) == len(parts) and all(map(fnmatch.fnmatchcase, parts, p)) for p in patterns):
            units[name] = module
    return units


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


def _timed(forward, args, kwargs, fastest: dict[str, float], name: str):
    """Run ``forward``, keeping its fastest time so far in ``fastest[name]``."""
    _wait((args, kwargs))
    start = time.perf_counter()
    output = forward(*args, **kwargs)
    _wait(output)
    seconds = time.perf_counter() - start
    fastest[name] = min(seconds, fastest.get(name, seconds))
    return output


class AsyncState:
    """What the hooks share: the stage plan, the latest output of every unit, and where this call stands."""

    def __init__(self, context, stages: int, stage: int, ranks: list[int], group, warmup: int, stride: int,
                 cooldown: int = 0, extrapolate: int = 0):  # fmt: skip
        self.context, self.stages, self.stage, self.ranks, self.group = context, stages, stage, ranks, group
        self.warmup, self.stride, self.cooldown, self.extrapolate = warmup, stride, cooldown, extrapolate
        self.order: list[str] = []  # units in the order they ran at the first call
        self.costs: dict[str, float] = {}  # fastest time of each unit over the first call's warm-up
        self.owner: dict[str, int] | None = None  # stage of each unit, fixed once the first warm-up ends
        self.cache: dict[str, object] = {}  # each unit's latest output known on this rank
        self.call, self.index, self.batch = -1, 0, None
        self.sequential = True  # the current denoiser call runs whole on every rank
        self.fresh = True  # every rank holds every unit's output of the previous call (it ran whole)
        self.producer: dict[
            int, str
        ] = {}  # id of a unit's output tensor -> unit (first call, to trace reads)
        self.reads: dict[str, set[str]] = {}  # hooked module -> units whose outputs it took as inputs
        self.send: dict[int, list[str]] = {}  # stage -> its units whose outputs later stages read
        self.selective = True  # False: exchange every output of a stage (tests compare the two)
        self.known: dict[str, list] = {}  # extrapolate: unit -> its last two (timestep, output), newest last
        self.buffers: dict[tuple[str, int], torch.Tensor] = {}  # extrapolate: where the views are written
        self.view: dict[str, object] = {}  # extrapolate: earlier stages' outputs as this stage reads them
        self.last_timestep: float | None = None  # of the previous denoiser call of this call
        self.replan, self.replanned, self.planned_call = True, False, -1  # re-cut once, at the second call
        self.staged_costs: dict[str, float] = {}  # fastest time of each own layer in the staged steps

    def stage_costs(self) -> list[float]:
        """Measured seconds per stage (the timings of the current cut)."""
        out = [0.0] * self.stages
        for name, stage in (self.owner or {}).items():
            out[stage] += self.costs[name]
        return out

    def begin(self, batch: int | None) -> None:
        ctx = self.context
        if ctx.call_index != self.call:
            self.call, self.index, self.fresh = ctx.call_index, 0, True
            self.known.clear()
            self.view.clear()
        self.producer.clear()  # tensor ids are traced within one denoiser call
        cooling = self.cooldown and ctx.num_steps and ctx.step >= ctx.num_steps - self.cooldown
        self.sequential = self.index < self.warmup or batch != self.batch or bool(cooling)
        self.batch = batch
        if not self.sequential and self.owner is None:
            self._plan()
        elif not self.sequential and self.replan and not self.replanned and self.call > self.planned_call:
            self._replan()  # the first staged step of the second call: every rank holds fresh outputs
        if not self.sequential and not self.fresh and (self.index - self.warmup) % self.stride == 0:
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
        return self.send[stage] if self.selective else [n for n in self.order if self.owner[n] == stage]

    def _plan(self) -> None:
        costs = torch.tensor([self.costs[n] for n in self.order], dtype=torch.float64)
        self._collective(dist.broadcast, costs, src=self.ranks[0])  # one timing for all: identical cuts
        self._cut(costs)
        self.planned_call = self.call

    def _replan(self) -> None:
        """Cut again on the staged timings: each layer timed by its owner while the stages ran at once (the
        warm-up's whole-model timings misjudge some layers, at large batches by up to 1.6x)."""
        self.replanned = True
        costs = torch.tensor([self.staged_costs.get(n, 0.0) for n in self.order], dtype=torch.float64)
        self._collective(dist.all_reduce, costs)  # every layer was timed on exactly one rank of the group
        if bool((costs > 0).all()):
            self._cut(costs)

    def _cut(self, costs: torch.Tensor) -> None:
        if len(self.order) < self.stages:
            raise AcceleratorError(f"parallel(mode=async): {len(self.order)} layers ran, fewer than "
                                   f"stages={self.stages}")  # fmt: skip
        self.costs = dict(zip(self.order, costs.tolist()))
        self.owner = dict(zip(self.order, balanced_cuts(costs.tolist(), self.stages)))
        self.send.clear()
        for stage in range(self.stages):
            names = [n for n in self.order if self.owner[n] == stage]
            wanted = {names[-1]}  # the boundary: it may reach the next stage through glue code (no tracing)
            for consumer, producers in self.reads.items():  # a block's inputs go to every unit inside it
                inside = [u for u in self.order if u == consumer or u.startswith(consumer + ".")]
                if any(self.owner[u] > stage for u in inside):
                    wanted |= {p for p in producers if self.owner[p] == stage}
            self.send[stage] = [n for n in names if n in wanted]
        self.producer.clear()

    def trace(self, name: str, inputs, output=None) -> None:
        """First call: which units' outputs each hooked module takes in (by tensor identity)."""
        if self.owner is not None or not self.sequential:
            return
        found = {self.producer[id(t)] for t in _tensors(inputs) if id(t) in self.producer}
        self.reads.setdefault(name, set()).update(found)
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
            raise RuntimeError(f"parallel(mode=async): rank {dist.get_rank()} lost its peers at step "
                               f"{self.context.step}: {error}") from error  # fmt: skip


class StageUnitHook(ModelHook):
    """On one layer: run it (own stage, or a sequential call), else return its owner's latest output."""

    def __init__(self, state: AsyncState, name: str):
        super().__init__()
        self.state, self.name = state, name

    def new_forward(self, module, *args, **kwargs):
        st, forward = self.state, self.fn_ref.original_forward
        if st.sequential:
            if st.owner is None:  # the first call: record the order and time every layer
                output = _timed(forward, args, kwargs, st.costs, self.name)
                st.trace(self.name, (args, kwargs), output)
                if self.name not in st.order:
                    st.order.append(self.name)
            else:
                output = forward(*args, **kwargs)
        elif st.owner.get(self.name, st.stage) == st.stage:  # layers the plan never saw run everywhere
            if st.replan and not st.replanned:
                output = _timed(forward, args, kwargs, st.staged_costs, self.name)
            else:
                output = forward(*args, **kwargs)
        else:
            return st.view.get(self.name, st.cache[self.name]) if st.extrapolate else st.cache[self.name]
        st.cache[self.name] = output
        return output


class BlockReadHook(ModelHook):
    """On a block holding layers (a UNet's down/mid/up block): traces which layer outputs it takes in (skips)."""

    def __init__(self, state: AsyncState, name: str):
        super().__init__()
        self.state, self.name = state, name

    def pre_forward(self, module, *args, **kwargs):
        self.state.trace(self.name, (args, kwargs))
        return args, kwargs


class AsyncDenoiserHook(ModelHook):
    """On the denoiser: exchange the stages' activations before the call, share the prediction after it."""

    def __init__(self, state: AsyncState):
        super().__init__()
        self.state = state

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        st.begin(batch_size_of(args, kwargs))
        try:
            output = self.fn_ref.original_forward(*args, **kwargs)
        finally:
            st.end()
        return st.share_prediction(output)


def _blocks(denoiser) -> dict[str, torch.nn.Module]:
    """The denoiser's blocks (models.py ``blocks``: each element of a block list, or the block itself)."""
    found = {}
    for attr in denoiser_facts(denoiser, "parallel(mode=async)").blocks:
        value = getattr(denoiser, attr, None)
        if isinstance(value, torch.nn.ModuleList):
            found.update({f"{attr}.{i}": block for i, block in enumerate(value)})
        elif value is not None:
            found[attr] = value
    return found


def install_async(fp, stages: int, stage: int, ranks: list[int], group, warmup: int, stride: int,
                  cooldown: int = 0, extrapolate: int = 0) -> HandleGroup:  # fmt: skip
    """Hook the layers and the denoiser of ``fp`` for stage ``stage`` of ``stages`` (``ranks``: global ranks)."""
    units = stage_units(fp.denoiser)
    if len(units) < stages:
        raise AcceleratorError(f"parallel(mode=async): {type(fp.denoiser).__name__} has {len(units)} layers to "
                               f"split, fewer than stages={stages}")  # fmt: skip
    state = AsyncState(fp.context, stages, stage, ranks, group, warmup, stride, cooldown, extrapolate)
    handles = []
    try:
        for name, module in units.items():
            handles.append(install_hook(module, StageUnitHook(state, name), HOOK_NAME, fp.context))
        for name, module in _blocks(fp.denoiser).items():
            if name not in units:
                handles.append(install_hook(module, BlockReadHook(state, name), HOOK_NAME, fp.context))
        handles.append(install_hook(fp.denoiser, AsyncDenoiserHook(state), HOOK_NAME, fp.context))
    except BaseException:
        for handle in reversed(handles):
            handle.remove()
        raise
    group_handle = HandleGroup(handles)
    group_handle.info.update(state=state)
    return group_handle
