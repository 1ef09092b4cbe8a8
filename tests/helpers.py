"""Helpers shared by the test modules: tiny pipelines, seeded calls, PSNR, call counters, a branch splitter.

Imported as ``from helpers import ...``: pytest puts tests/ on sys.path (rootdir-relative ``prepend``
import mode, no ``__init__.py`` here), as it does for conftest.py.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
import pytest
import torch
from diffusers import DiffusionPipeline
from diffusers.hooks import ModelHook

from fastdiff import FastPipeline
from fastdiff.zoo.tiny import make_pipeline

PROMPTS = ("a red fox", "a blue car")
LABELS = (1, 2)


def tiny_pipe(name: str) -> DiffusionPipeline:
    """The test-size zoo pipeline ``name`` (seed 0), progress bar off."""
    pipe = make_pipeline(name, "test")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_fp(name: str, spec: str | None = None) -> FastPipeline:
    """A FastPipeline over :func:`tiny_pipe`; ``spec`` (e.g. a scheduler preset) is applied if given."""
    fp = FastPipeline(tiny_pipe(name))
    if spec is not None:
        fp.accelerate(spec)
    return fp


def call_kwargs(
    pipe,
    steps: int | None = 3,
    guidance: float | None = None,
    seed: int | None = 0,
    prompts=PROMPTS,
    labels=LABELS,
    batch_size: int = 2,
    **extra,
) -> dict:
    """Keyword arguments for one call of a test pipeline, returning numpy images.

    The inputs follow the pipeline type: ``prompts`` for StableDiffusion*, ``labels`` (as class_labels) for
    DiT and ClassConditionalPipeline, ``batch_size`` for the others. ``steps``, ``guidance`` and ``seed``
    left None are not passed (the pipeline's or the scheduler preset's default; the global generator);
    a seed gives a fresh ``torch.Generator``. ``extra`` keywords are passed on as they are and win.
    """
    kwargs = {"output_type": "np"}
    if steps is not None:
        kwargs["num_inference_steps"] = steps
    if seed is not None:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    name = type(pipe).__name__
    if name.startswith("StableDiffusion"):
        kwargs["prompt"] = list(prompts)
    elif name in ("DiTPipeline", "ClassConditionalPipeline"):
        kwargs["class_labels"] = list(labels)
    else:
        kwargs["batch_size"] = batch_size
    if guidance is not None:
        kwargs["guidance_scale"] = guidance
    return {**kwargs, **extra}


def call(fp: FastPipeline, **options) -> np.ndarray:
    """The images of ``fp(**call_kwargs(fp.pipe, **options))``: every call gets a freshly seeded generator.

    A module with other defaults binds them once, e.g. ``run = functools.partial(call, steps=6, guidance=4.0)``.
    """
    return fp(**call_kwargs(fp.pipe, **options)).images


def psnr(a: np.ndarray, b: np.ndarray, *, float64: bool = False, floor: float | None = None) -> float:
    """PSNR in dB of images in [0, 1]; ``float64`` computes in double precision, ``floor`` caps the MSE below."""
    if float64:
        a = a.astype(np.float64)
    mse = np.mean((a - b) ** 2)
    if floor is not None:
        mse = max(mse, floor)
    return float(10 * np.log10(1.0 / mse))


class Counter:
    """Counts real calls of a (leaf) module: skipped work never reaches it. ``handle.remove()`` detaches."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self.handle = module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


class SplitBranches(ModelHook):
    """Test stand-in for a batch-changing accelerator: on odd steps, one denoiser call per branch, reversed.

    The per-branch outputs are joined in the denoiser's own output form: a tuple (first element) or an
    output dataclass (``.sample``).
    """

    def __init__(self, context):
        super().__init__()
        self.context = context

    def new_forward(self, module, *args, **kwargs):
        ctx, branches = self.context, self.context.branches
        if ctx.step % 2 == 0 or len(branches) == 1:
            return self.fn_ref.original_forward(*args, **kwargs)
        batch, parts = args[0].shape[0], {}

        def part(x, i):
            return x.chunk(len(branches))[i] if torch.is_tensor(x) and x.ndim and x.shape[0] == batch else x

        for i in reversed(range(len(branches))):
            ctx.branches = (branches[i],)
            a, k = [part(x, i) for x in args], {key: part(x, i) for key, x in kwargs.items()}
            parts[i] = self.fn_ref.original_forward(*a, **k)
        ctx.branches = branches
        outputs = [parts[i] for i in range(len(branches))]
        if isinstance(outputs[0], tuple):
            return (torch.cat([out[0] for out in outputs]),)
        return type(outputs[0])(sample=torch.cat([out.sample for out in outputs]))


def kill_rank_one_at(rank: int, world: int, model: str, specs: str, call: dict, step: int) -> np.ndarray:
    """Worker for ``launch``: an accelerated call in which rank 1 kills itself (SIGKILL) at denoising ``step``."""
    fp = FastPipeline.from_pretrained(model, accelerators=specs)
    fp.pipe.set_progress_bar_config(disable=True)

    def die(pipe, i, timestep, kwargs):
        if rank == 1 and i == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return kwargs

    return fp(**call, output_type="np", callback_on_step_end=die).images


def assert_dead_rank_ends_the_run(model, specs: str, call: dict, step: int) -> None:
    """Two workers, rank 1 killed mid-call: ``ParallelError`` names it within 90 s and no worker is left."""
    from fastdiff.parallel.launch import ParallelError, launch

    start = time.monotonic()
    with pytest.raises(ParallelError, match="rank 1") as failed:
        launch(kill_rank_one_at, 2, str(model), specs, call, step, timeout_s=20)
    assert time.monotonic() - start < 90 and len(failed.value.pids) == 2
    alive = [p for p in failed.value.pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive
