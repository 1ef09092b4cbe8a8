"""The step context the wrapper publishes to hooks: call, step, timestep, total steps, guidance branches, NFE.

Hooks read ``fp.context`` and never search ``scheduler.timesteps`` themselves. Stateful hooks compare
``context.call_index`` with the call they last saw to clear their state at the start of every call.

Example::

    fp = FastPipeline(pipe)
    fp(prompt="a cat", num_inference_steps=4)
    assert fp.context.nfe == 4  # one batched CFG call per step
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers.hooks import ModelHook


@dataclass
class StepContext:
    """Mutable state of the current pipeline call, written only by the wrapper (and batch-changing hooks)."""

    call_index: int = 0  # increases by one at the start of every pipeline call
    step: int = 0  # scheduler steps completed in this call = index of the step being computed
    num_steps: int = 0  # len(scheduler.timesteps) of this call
    timestep: float | None = None  # timestep passed to the current denoiser call
    cfg: bool = False  # the pipeline batches guidance branches in this call
    cfg_layout: tuple[str, ...] = ("uncond", "cond")  # branch order of a CFG batch (model fact)
    branches: tuple[str, ...] = ("cond",)  # branch of each equal chunk of the current denoiser batch
    nfe: int = 0  # denoiser forward evaluations in this call
    total_nfe: int = 0  # over the wrapper's lifetime
    extras: dict = field(default_factory=dict)

    @property
    def progress(self) -> float:
        """Fraction of the trajectory done before the current step, in [0, 1)."""
        return self.step / self.num_steps if self.num_steps else 0.0

    def begin_call(self, cfg: bool, cfg_layout: tuple[str, ...]) -> None:
        self.call_index += 1
        self.step, self.num_steps, self.nfe, self.timestep = 0, 0, 0, None
        self.cfg, self.cfg_layout = cfg, cfg_layout
        self.branches = cfg_layout if cfg else ("cond",)

    def split(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a batch-first tensor of the current denoiser call into its branches."""
        chunks = tensor.chunk(len(self.branches), dim=0)
        return dict(zip(self.branches, chunks))


class ContextHook(ModelHook):
    """Outermost hook on the denoiser: publishes timestep, branches and total steps before any other hook."""

    outermost = True

    def __init__(self, context: StepContext, scheduler_of):
        super().__init__()
        self.context = context
        self.scheduler_of = scheduler_of  # callable returning the pipeline's current scheduler

    def pre_forward(self, module, *args, **kwargs):
        ctx = self.context
        timestep = args[1] if len(args) > 1 else kwargs.get("timestep")
        if isinstance(timestep, torch.Tensor):
            timestep = timestep.flatten()[0].item() if timestep.numel() else None
        ctx.timestep = None if timestep is None else float(timestep)
        if ctx.nfe == 0 or not ctx.num_steps:
            timesteps = getattr(self.scheduler_of(), "timesteps", None)
            ctx.num_steps = 0 if timesteps is None else len(timesteps)
        ctx.branches = ctx.cfg_layout if ctx.cfg else ("cond",)
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
