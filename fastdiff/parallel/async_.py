"""``parallel(mode=async)``: AsyncDiff (Chen et al. 2024), the denoiser split into stages run at once on N ranks.

The denoiser's layers (``stage_units`` in fastdiff/core/models.py: UNet resnets/attentions/samplers, DiT blocks)
get a named hook each. The first ``warmup`` denoiser calls of a call run the whole model on every rank; the
first of them also records the order the layers run in and times each one. Then the layers are cut into
``stages`` contiguous stages of about equal measured cost (rank 0's timings, broadcast so that every rank
cuts alike), stage k on rank k. From then on, at every denoiser call each rank computes only its own stage;
every other layer returns the output its owner produced at the previous call, exchanged at the start of the
call (one broadcast per stage but the last), so stage k consumes stage k-1's output from the previous step and
all stages compute at once. With two stages the exchange overlaps the computing: stage 0 posts each output
that stage 1 reads as soon as it is computed (``dist.broadcast(..., async_op=True)``), stage 1 posts the
receives at the start of its step and waits for them at the start of the next one (async_exchange.py).
From the second call on, the layers are cut again at the start of each call, on
the median times of the previous call's staged steps (each layer timed by its owner while all stages ran), until
the stages' measured times are within 5% of each other, the cut stops changing, or three re-cuts have been made
(``Settling`` in async_state.py); that cut is then kept (a cut changes which activations are stale, so a call's image can differ from the previous
call's until the cut settles). Whole layers rarely balance (one UNet layer at full resolution can be a tenth of
a step), so the first layer of a stage may share its batch rows with the stage before (async_plan.py): that
stage computes the first rows on its fresh features and sends them at the next exchange, the owner computes the
rest; each row is then computed as under one of the two whole-layer cuts. UNet skip features come along the
same way as other activations (they are layer outputs). The last stage's prediction is broadcast to every
rank, so the sampler state stays identical everywhere.

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

import dataclasses
import fnmatch
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.diffusers_compat import StatefulHook
from fastdiff.core.hooks import HandleGroup, install_hooks
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.core.tensors import batch_size_of
from fastdiff.parallel.async_plan import balanced_cuts, cat_rows, head_key, rows_of
from fastdiff.parallel.async_state import MAX_RECUTS, AsyncState
from fastdiff.parallel.group import ParallelConfig

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

    pass

HOOK_NAME = "fastdiff.parallel-async"
__all__ = ["MAX_RECUTS", "AsyncState", "ParallelAsync", "balanced_cuts", "install_async", "stage_units"]


@register
@dataclasses.dataclass(frozen=True)
class ParallelAsync(ParallelConfig):
    """The denoiser in ``stages`` (default: devices) stages, one per rank, AsyncDiff-style, after ``warmup``
    whole denoiser calls per call, with activations exchanged every ``stride`` steps; the last ``cooldown``
    steps run whole again (their small updates are where stale activations show most); ``extrapolate=1``
    carries the stale activations on linearly to the current timestep; ``balance=layers`` cuts the layers into
    stages of equal count instead of equal measured time (the same cut, hence the same images, on any machine
    and load). Example: ``parallel(mode=async,devices=2,extrapolate=1)``."""

    mode: Literal["async"] = "async"
    devices: int = option(2, ge=1)
    stages: int | None = option(None, ge=2)
    warmup: int = option(2, ge=1)
    stride: int = option(1, ge=1)
    cooldown: int = option(0, ge=0)
    extrapolate: int = option(0, choices=(0, 1))
    balance: Literal["time", "layers"] = "time"

    touches = frozenset({"denoiser.forward", "denoiser.blocks"})
    exclusive = frozenset({"denoiser.blocks"})  # deepcache and blockcache hook the same blocks
    branches: ClassVar[int] = 1  # guidance branches side by side, each staged (devices = branches x stages)

    def validate(self) -> None:
        each, where = self.branches, f"parallel(mode={self.mode})"
        if self.stages is not None and self.stages * each != self.devices:
            raise AcceleratorError(
                f"{where}: devices must be {each * self.stages} (stages={self.stages}"
                f"{' x 2 guidance branches' * (each > 1)}), got {self.devices}"
            )
        if self.devices % each:
            raise AcceleratorError(f"{where}: devices must be even (2 guidance branches x stages), got {self.devices}")
        if self.stage_count() < 2:
            raise AcceleratorError(
                f"{where} needs at least 2 stages: devices must be >= {2 * each}, got {self.devices}"
            )

    def stage_count(self) -> int:
        return self.stages or self.devices // self.branches

    def apply(self, fp: FastPipeline) -> HandleGroup:
        stage_units(fp.denoiser)  # an unsupported denoiser fails before the process group is looked at
        return install_async(fp, self, self.group_rank(), list(range(self.devices)))


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


class StageUnitHook(ModelHook):
    """On one layer: run it (own stage, or a sequential call), else return its owner's latest output."""

    def __init__(self, state: AsyncState, name: str):
        super().__init__()
        self.state, self.name = state, name

    def new_forward(self, module, *args, **kwargs):
        st, forward, name = self.state, self.fn_ref.original_forward, self.name
        plan = st.plan
        if st.sequential:
            if plan is None:  # the first call: record the order and time every layer
                output = st.trace.unit(name, forward, args, kwargs, st.batch)
            else:
                output = forward(*args, **kwargs)
                if name in plan.split:
                    st.cache[head_key(name)] = rows_of(output, st.batch, 0, st.rows(name))
        elif name in plan.split and st.stage in (plan.split[name][0], plan.owner[name]):
            return self._shared(forward, args, kwargs)
        elif plan.owner.get(name, st.stage) == st.stage:  # layers the plan never saw run everywhere
            output = st.settling.run(forward, args, kwargs, name)
        else:
            return st.latest(name)
        st.cache[name] = output
        if not st.sequential:
            st.computed(name)
        return output

    def _shared(self, forward, args, kwargs):
        """A unit shared by rows: the earlier stage computes the head rows on its fresh inputs (they reach the
        owner at the next exchange), the owner the rest on its inputs from the previous step. Both are the
        unit applied to the same step's features, so the owner's output is as if it computed every row."""
        st, head, rows = self.state, head_key(self.name), self.state.rows(self.name)
        mine = (0, rows) if st.stage == st.plan.split[self.name][0] else (rows, None)
        args, kwargs = rows_of((args, kwargs), st.batch, *mine)
        part = st.settling.run(forward, args, kwargs, self.name)
        if mine[0] == 0:  # glue after it runs on the rest of the rows too; its results here are not used
            st.cache[head] = part
            st.computed(head)
            return cat_rows(part, rows_of(st.cache[self.name], st.batch, rows, None))
        st.cache[self.name] = output = cat_rows(st.latest(head), part)
        return output


class BlockReadHook(ModelHook):
    """On a block holding layers (a UNet's down/mid/up block): traces which layer outputs it takes in (skips)."""

    def __init__(self, state: AsyncState, name: str):
        super().__init__()
        self.state, self.name = state, name

    def pre_forward(self, module, *args, **kwargs):
        if self.state.plan is None and self.state.sequential:
            self.state.trace.read(self.name, (args, kwargs))
        return args, kwargs


class AsyncDenoiserHook(StatefulHook):
    """On the denoiser: exchange the stages' activations before the call, share the prediction after it.
    Stateful: diffusers' hook reset at the start of every call clears the state's per-call part."""

    def __init__(self, state: AsyncState):
        super().__init__()
        self.state = state

    def reset_state(self, module):
        self.state.reset()
        return module

    def new_forward(self, module, *args, **kwargs):
        st = self.state
        # refused at the call's first denoiser call, before any model work (the second check catches a
        # separate-call pipeline the facts did not predict)
        if st.context.separate_cfg or (st.context.cfg_sequence and st.context.branches != ("cond",)):
            raise AcceleratorError(
                "parallel(mode=async) keeps one set of stale activations per step; guidance run as separate "
                "denoiser calls (true CFG: true_cfg_scale > 1 with a negative prompt) "
                "would feed one branch's activations to the other. Call without true CFG, or use "
                "parallel(mode=cfg)"
            )
        st.begin(batch_size_of(args, kwargs))
        try:
            output = self.fn_ref.original_forward(*args, **kwargs)
        finally:
            st.end()
        st.computed(None)  # stage 0: whatever it has not sent yet, before the prediction's broadcast
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


def install_async(fp, config: ParallelAsync, stage: int, ranks: list[int], group=None) -> HandleGroup:
    """Hook the layers and the denoiser of ``fp`` for stage ``stage`` of ``config`` (``ranks``: the global ranks
    of the stages, in ``group``)."""
    stages, units = config.stage_count(), stage_units(fp.denoiser)
    if len(units) < stages:
        raise AcceleratorError(
            f"parallel(mode=async): {type(fp.denoiser).__name__} has {len(units)} layers to "
            f"split, fewer than stages={stages}"
        )
    state = AsyncState(fp.context, config, stage, ranks, group)
    hooks = [(module, StageUnitHook(state, name)) for name, module in units.items()]
    hooks += [
        (module, BlockReadHook(state, name)) for name, module in _blocks(fp.denoiser).items() if name not in units
    ]
    group_handle = install_hooks(hooks + [(fp.denoiser, AsyncDenoiserHook(state))], HOOK_NAME, fp.context)
    group_handle.info.update(state=state)
    return group_handle
