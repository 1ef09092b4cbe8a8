"""The step context the wrapper publishes to hooks: call, step, timestep, total steps, guidance branches, NFE.

Hooks read ``fp.context`` and never search ``scheduler.timesteps`` themselves. Stateful hooks compare
``context.call_index`` with the call they last saw to clear their state at the start of every call.

Everything per step is derived at each denoiser call from what actually arrives: the branch layout from the
batch size (a callback that turns guidance off mid-call halves the batch, and the branches become
``("cond",)``), the step from the scheduler steps taken in this call, and the number of steps from the steps
the pipeline actually runs (``pipe._num_timesteps``: fewer than ``len(scheduler.timesteps)`` with img2img
``strength``). ``active`` is true only inside ``fp(...)``; gated hooks are inert outside it.

Example::

    fp = FastPipeline(pipe)
    fp(prompt="a cat", num_inference_steps=4)
    assert fp.context.nfe == 4  # one batched CFG call per step
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.tensors import batch_size_of

_OWNERS = itertools.count()
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # owner -> the context made for it


@dataclass
class StepContext:
    """Mutable state of the current pipeline call, written only by the wrapper (and batch-changing hooks)."""

    call_index: int = 0  # increases by one at the start of every pipeline call
    step: int = 0  # scheduler steps completed in this call = index of the step being computed
    num_steps: int = 0  # steps this call runs (img2img strength runs fewer than the schedule holds)
    # the current denoiser call's timestep as passed: a device tensor is read to the host (a synchronisation)
    # only when a hook reads ``timestep``, so the plain wrapper adds none per step
    raw_timestep: object = None
    cfg: bool = False  # the call started with guidance branches batched
    cfg_layout: tuple[str, ...] = ("uncond", "cond")  # branch order of a CFG batch (model fact)
    branches: tuple[str, ...] = ("cond",)  # branch of each equal chunk of the current denoiser batch
    branch_batch: int = 0  # images per branch, from the first denoiser call of this call
    cfg_sequence: tuple[str, ...] = ()  # branch of the k-th denoiser call of a step (separate-call guidance)
    separate_cfg: bool = False  # this call runs its guidance branches as separate denoiser calls
    step_calls: int = 0  # denoiser calls seen so far in the current step
    calls_step: int = -1  # the step step_calls counts
    denoiser_calls: int = 0  # denoiser calls seen in this call (skipped ones included)
    nfe: int = 0  # denoiser forward evaluations in this call
    total_nfe: int = 0  # over the wrapper's lifetime
    active: bool = False  # inside a call of the owning FastPipeline
    owner: int = field(default_factory=lambda: next(_OWNERS))  # makes hook names unique per wrapper
    extras: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _LIVE[self.owner] = self

    @property
    def is_copy(self) -> bool:
        """Made by copying (a deep copy or pickle of a hooked model), not by a wrapper: nothing ever activates it."""
        return _LIVE.get(self.owner) is not self

    @property
    def timestep(self) -> float | None:
        """Timestep passed to the current denoiser call (the first element of a per-sample tensor)."""
        raw = self.raw_timestep
        if isinstance(raw, torch.Tensor):
            raw = self.raw_timestep = raw.flatten()[0].item() if raw.numel() else None
        return None if raw is None else float(raw)  # type: ignore[arg-type]  # a number once read

    @timestep.setter
    def timestep(self, value) -> None:
        self.raw_timestep = value

    @property
    def progress(self) -> float:
        """Fraction of the trajectory done before the current step, in [0, 1)."""
        return min(self.step / self.num_steps, 1.0) if self.num_steps else 0.0

    def begin_call(
        self,
        cfg: bool,
        cfg_layout: tuple[str, ...],
        cfg_sequence: tuple[str, ...] = (),
        separate: bool = False,
    ) -> None:
        """Reset the per-call state; ``separate``: this call runs guidance as separate denoiser calls."""
        self.call_index += 1
        self.separate_cfg = separate
        self.step, self.num_steps, self.nfe, self.timestep = 0, 0, 0, None
        self.denoiser_calls, self.branch_batch, self.step_calls, self.calls_step = 0, 0, 0, -1
        self.cfg, self.cfg_layout, self.cfg_sequence = cfg, cfg_layout, cfg_sequence
        self.branches = cfg_layout if cfg else ("cond",)

    def next_call_branches(self, batch: int | None) -> tuple[str, ...]:
        """Branches of the denoiser call now starting; counts it among this step's calls.

        A batch holding every branch of the guidance layout is that layout; otherwise ``cond``, except in
        pipelines that run guidance as separate calls (``cfg_sequence``: Flux's true CFG), where the k-th call of
        a step is the k-th branch of the sequence (a call past it gets a branch of its own, ``call2`` ...).
        """
        if self.calls_step != self.step:
            self.calls_step, self.step_calls = self.step, 0
        k, self.step_calls = self.step_calls, self.step_calls + 1
        branches = self.branches_for(batch)
        if k and branches == ("cond",) and self.cfg_sequence:
            return (self.cfg_sequence[k],) if k < len(self.cfg_sequence) else (f"call{k}",)
        return branches

    def branches_for(self, batch: int | None) -> tuple[str, ...]:
        """Branch layout of a denoiser batch: the guidance layout when it holds every branch, else ``cond``."""
        layout = self.cfg_layout
        if not layout:
            return ("cond",)
        if batch is None or not self.branch_batch:
            return self.branches
        return layout if batch == self.branch_batch * len(layout) else ("cond",)

    def split(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a batch-first tensor of the current denoiser call into its branches."""
        chunks = tensor.chunk(len(self.branches), dim=0)
        return dict(zip(self.branches, chunks))


class ContextHook(ModelHook):
    """Outermost hook on the denoiser: publishes timestep, branches and total steps before any other hook."""

    outermost = True

    def __init__(self, context: StepContext, pipe_of):
        super().__init__()
        self.context = context
        self.pipe_of = pipe_of  # callable returning the wrapped diffusers pipeline

    def pre_forward(self, module, *args, **kwargs):
        ctx = self.context
        ctx.raw_timestep = args[1] if len(args) > 1 else kwargs.get("timestep")
        sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
        # a tensor sample inline (host time on every step); batch_size_of reads the other layouts
        batch = sample.shape[0] if type(sample) is torch.Tensor and sample.dim() else batch_size_of(args, kwargs)
        if ctx.denoiser_calls == 0:
            pipe = self.pipe_of()
            steps = pipe.__dict__.get("_num_timesteps")
            if not isinstance(steps, int) or steps <= 0:
                timesteps = getattr(pipe.scheduler, "timesteps", None)
                steps = 0 if timesteps is None else len(timesteps)
            ctx.num_steps = steps
            if batch is not None:
                ctx.branch_batch = batch // len(ctx.cfg_layout) if ctx.cfg else batch
        ctx.denoiser_calls += 1
        ctx.branches = ctx.next_call_branches(batch)
        return args, kwargs


class CountHook(ModelHook):
    """Innermost hook on the denoiser: counts real forward evaluations (skipped calls are not counted)."""

    def __init__(self, context: StepContext):
        super().__init__()
        self.context = context

    def pre_forward(self, module, *args, **kwargs):
        self.context.nfe += 1
        self.context.total_nfe += 1
        return args, kwargs
