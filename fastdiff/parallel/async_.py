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
receives at the start of its step and waits for them at the start of the next one. From the second call on, the layers are cut again at the start of each call, on
the median times of the previous call's staged steps (each layer timed by its owner while all stages ran), until
the stages' measured times are within 5% of each other, the cut stops changing, or three re-cuts have been made;
that cut is then kept (a cut changes which activations are stale, so a call's image can differ from the previous
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

import fnmatch

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import HandleGroup, install_hook
from fastdiff.core.models import UnsupportedModelError, denoiser_facts
from fastdiff.core.registry import AcceleratorError
from fastdiff.core.tensors import batch_size_of
from fastdiff.parallel.async_plan import balanced_cuts, cat_rows, rows_of
from fastdiff.parallel.async_state import MAX_RECUTS, AsyncState, head_key, timed_call

HOOK_NAME = "fastdiff.parallel-async"
__all__ = ["MAX_RECUTS", "AsyncState", "balanced_cuts", "install_async", "stage_units"]


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
        st, forward = self.state, self.fn_ref.original_forward
        if st.sequential:
            if st.owner is None:  # the first call: record the order and time every layer
                output = timed_call(forward, args, kwargs, st.warmup_times, self.name)
                st.trace(self.name, (args, kwargs), output)
                if self.name not in st.order:
                    st.order.append(self.name)
            else:
                output = forward(*args, **kwargs)
            if self.name in st.split:
                st.cache[head_key(self.name)] = rows_of(output, st.batch, 0, st.rows(self.name))
        elif self.name in st.split and st.stage in (st.split[self.name][0], st.owner[self.name]):
            return self._shared(forward, args, kwargs)
        elif st.owner.get(self.name, st.stage) == st.stage:  # layers the plan never saw run everywhere
            output = self._staged(forward, args, kwargs)
        else:
            return st.view.get(self.name, st.cache[self.name]) if st.extrapolate else st.cache[self.name]
        st.cache[self.name] = output
        if not st.sequential:
            st.computed(self.name)
        return output

    def _staged(self, forward, args, kwargs):
        """This rank's part of a staged step, timed while the cut may still change."""
        st = self.state
        if not st.tuning:
            return forward(*args, **kwargs)
        st.staged_call = st.call
        return timed_call(forward, args, kwargs, st.staged_times, self.name)

    def _shared(self, forward, args, kwargs):
        """A unit shared by rows: the earlier stage computes the head rows on its fresh inputs (they reach the
        owner at the next exchange), the owner the rest on its inputs from the previous step. Both are the
        unit applied to the same step's features, so the owner's output is as if it computed every row."""
        st, head, rows = self.state, head_key(self.name), self.state.rows(self.name)
        mine = (0, rows) if st.stage == st.split[self.name][0] else (rows, None)
        args, kwargs = rows_of((args, kwargs), st.batch, *mine)
        part = self._staged(forward, args, kwargs)
        if mine[0] == 0:  # glue after it runs on the rest of the rows too; its results here are not used
            st.cache[head] = part
            st.computed(head)
            return cat_rows(part, rows_of(st.cache[self.name], st.batch, rows, None))
        earlier = st.view.get(head, st.cache[head]) if st.extrapolate else st.cache[head]
        st.cache[self.name] = output = cat_rows(earlier, part)
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
        # refused at the call's first denoiser call, before any model work (the second check catches a
        # separate-call pipeline the facts did not predict)
        if st.context.separate_cfg or (st.context.cfg_sequence and st.context.branches != ("cond",)):
            raise AcceleratorError(
                "parallel(mode=async) keeps one set of stale activations per step; guidance run as separate "
                "denoiser calls (true CFG: true_cfg_scale > 1 with a negative prompt) "
                "would feed one branch's activations to the other. Call without true CFG, or use "
                "parallel(mode=cfg)'s batched-guidance families"
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
