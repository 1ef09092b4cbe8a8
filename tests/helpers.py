"""Helpers shared by the test modules: tiny pipelines, seeded calls, PSNR, call counters, a branch splitter,
fresh weight copies and image checks for the zoo tests, and the checks both Gaussian-mixture models share.

Imported as ``from helpers import ...``: pytest puts tests/ on sys.path (rootdir-relative ``prepend``
import mode, no ``__init__.py`` here), as it does for conftest.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from diffusers import DiffusionPipeline
from diffusers.hooks import ModelHook

from fastdiff import FastPipeline, load_pipeline
from fastdiff.core.tensors import pixels
from fastdiff.zoo import ZOO, build
from fastdiff.zoo.gmm_exact import ode_error
from fastdiff.zoo.tiny import make_pipeline

PROMPTS = ("a red fox", "a blue car")
LABELS = (1, 2)


def full_only(*values, ci: bool = False):
    """A parametrize case that only ``make test-full`` runs (marker ``full``), unless ``ci`` keeps it in ``make test``."""
    if ci:
        return values if len(values) > 1 else values[0]
    return pytest.param(*values, marks=pytest.mark.full)


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

    return pixels(fp(**call, output_type="np", callback_on_step_end=die))


def assert_dead_rank_ends_the_run(model, specs: str, call: dict, step: int) -> None:
    """Two workers, rank 1 killed mid-call: ``ParallelError`` names it within 90 s and no worker is left."""
    from fastdiff.parallel.launch import ParallelError, launch

    start = time.monotonic()
    with pytest.raises(ParallelError, match="rank 1") as failed:
        launch(kill_rank_one_at, 2, str(model), specs, call, step, timeout_s=20)
    assert time.monotonic() - start < 90 and len(failed.value.pids) == 2
    alive = [p for p in failed.value.pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive


def in_fresh_memory(pipe):
    """Copy every weight into a fresh (aligned) allocation.

    from_pretrained maps weights straight out of the safetensors files; after a tensor with an odd
    number of floats (e.g. a 3-channel conv bias) the following ones sit at 4-byte-aligned addresses and
    the CPU matmul kernels then round differently (about 1e-6), so exact comparison needs copies.
    """
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            for tensor in [*component.parameters(), *component.buffers()]:
                tensor.data = tensor.data.clone()
    return pipe


def saved_zoo_pipelines(tmp_path_factory, names, make) -> dict[str, tuple[DiffusionPipeline, Path]]:
    """For each zoo model of ``names``: (in-memory pipeline ``make(name, "test", seed=0)``, progress bar off;
    the directory ``fastdiff.zoo.build`` wrote with its registered builder at size "test", seed 0)."""
    pipelines = {}
    for name in names:
        assert ZOO[name][1] == ("test", "bench")
        directory = build(name, tmp_path_factory.mktemp(name), size="test", seed=0)
        pipe = make(name, "test", seed=0)
        pipe.set_progress_bar_config(disable=True)
        pipelines[name] = (pipe, directory)
    return pipelines


def assert_plausible_images(images: np.ndarray, shape: tuple[int, ...] = (1, 32, 32, 3)) -> None:
    """``images`` have ``shape``, are finite, lie in [0, 1] and are not constant."""
    assert images.shape == shape
    assert np.isfinite(images).all() and images.min() >= 0.0 and images.max() <= 1.0
    assert images.std() > 0.01, "a random-weight model should still give a non-constant image"


# -- the exact Gaussian-mixture models (tests/zoo/test_gmm.py, tests/zoo/test_gmm_flow.py) ---------------------------


def sample_mixture(denoiser, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` float64 draws (count, D) from the mixture of a GMM denoiser: components, then their noise."""
    mixture = denoiser.mixture()
    component = torch.multinomial(mixture["weights"], count, replacement=True, generator=generator)
    noise = torch.randn(count, mixture["means"].shape[1], generator=generator, dtype=torch.float64)
    return mixture["means"][component] + mixture["stds"][component] * noise


def orthogonality_z_scores(target: torch.Tensor, prediction: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """z-scores of E[(target - prediction) * g(x)] for g in {1, x, sin(2 x)}, per dimension.

    E[target | x] is the only function of x whose residual is orthogonal to every g(x); by the CLT each
    sample mean is ~N(0, SE^2) under that hypothesis: all z-scores are ~N(0, 1) iff prediction = E[target | x].
    """
    residual = target - prediction
    scores = []
    for feature in (torch.ones_like(x), x, torch.sin(2 * x)):
        product = residual * feature
        scores.append(product.mean(0) / (product.std(0) / product.shape[0] ** 0.5))
    return torch.cat(scores)


def assert_forward_dtype_and_per_sample_timesteps(denoiser, timesteps: torch.Tensor) -> torch.Tensor:
    """A batch of 3 at 3 ``timesteps`` matches each sample alone; float32 in, float32 out; float64 kept.

    Returns the (3, 1, 8, 8) input.
    """
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    batched = denoiser(x, timesteps).sample
    assert batched.dtype == torch.float32
    for row, t in enumerate(timesteps):
        assert torch.allclose(batched[row], denoiser(x[row : row + 1], t).sample[0], atol=1e-6)
    assert denoiser(x.double(), 5, return_dict=False)[0].dtype == torch.float64
    return x


def assert_mixture_statistics(samples: torch.Tensor, mixture: dict[str, torch.Tensor]) -> None:
    """``samples`` (N, C, H, W) look drawn from ``mixture``: the fraction nearest each component within 0.08
    of its weight (binomial SE <= 0.022 at N = 512), residuals standardized by it with mean ~0, variance ~1."""
    count = len(samples)
    flat = samples.reshape(count, -1)
    log_likelihood = (
        -0.5 * (((flat[:, None] - mixture["means"]) / mixture["stds"]) ** 2).sum(-1)
        - mixture["stds"].log().sum(-1)
        + mixture["weights"].log()
    )
    component = log_likelihood.argmax(-1)
    fractions = torch.bincount(component, minlength=len(mixture["weights"])).double() / count
    assert (fractions - mixture["weights"]).abs().max() < 0.08
    standardized = (flat - mixture["means"][component]) / mixture["stds"][component]
    assert standardized.mean().abs() < 0.1
    assert 0.8 < standardized.var() < 1.2


def assert_quality_matches_exact_solve(pipe, quality, exact_samples, initial_noise) -> None:
    """The registered ``quality`` evaluator of a GMM pipeline gives the ODE error against a direct exact
    solve from the same noise, the same again from its cache, and a plausible value for 8 steps."""
    call_kwargs = {"batch_size": 16, "num_inference_steps": 8, "generator": torch.Generator().manual_seed(5)}
    images = pipe(**call_kwargs).images
    result = quality(pipe, call_kwargs, images, seed=5)
    expected = ode_error(images, exact_samples(pipe, initial_noise(pipe, 16, seed=5)))
    assert result == {"ode_error": pytest.approx(expected, rel=1e-12)}
    assert quality(pipe, call_kwargs, images, seed=5) == result  # cached, same answer
    assert 0.1 < result["ode_error"] < 3


def assert_gmm_round_trip(pipe, build, path, pipeline_cls, denoiser_cls) -> DiffusionPipeline:
    """``build(path, size="test", seed=0)`` reloads (offline) as ``pipeline_cls`` over ``denoiser_cls`` with
    ``pipe``'s mixture buffers and images; returns the reloaded pipeline."""
    build(path, size="test", seed=0)
    loaded = load_pipeline(path)
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded, pipeline_cls) and isinstance(loaded.unet, denoiser_cls)
    for name in ("means", "stds", "log_weights"):
        assert torch.equal(getattr(loaded.unet, name), getattr(pipe.unet, name))
    kwargs = dict(batch_size=8, num_inference_steps=10, output_type="pt")
    original = pipe(**kwargs, generator=torch.Generator().manual_seed(2)).images
    assert torch.equal(loaded(**kwargs, generator=torch.Generator().manual_seed(2)).images, original)
    return loaded
