"""forecast: skipped denoiser calls predicted by polynomial extrapolation of the last full outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline
from diffusers.hooks import ModelHook

import fastdiff
from fastdiff import AcceleratorError, FastPipeline
from fastdiff.cache.forecast import ForecastHook
from fastdiff.core.context import StepContext
from fastdiff.core.hooks import install_hook
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.registry import available
from fastdiff.zoo.tiny import make_pipeline

STEPS = 20


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipes():
    out = {name: make_pipeline(name, "test") for name in ("tiny-sd", "tiny-dit")}
    for pipe in out.values():
        pipe.set_progress_bar_config(disable=True)
    return out


@pytest.fixture(params=["tiny-sd", "tiny-dit"])
def fp(request, pipes):
    wrapped = FastPipeline(pipes[request.param])
    wrapped.accelerate("scheduler(name=dpm++2m)")
    yield wrapped
    wrapped.unwrap()


def run(fp, guidance=4.0, steps=STEPS):
    kwargs = {"num_inference_steps": steps, "output_type": "np", "guidance_scale": guidance}
    if type(fp.pipe).__name__.startswith("StableDiffusion"):
        kwargs["prompt"] = ["a red fox", "a blue car"]
    else:
        kwargs["class_labels"] = [1, 2]
    return fp(**kwargs, generator=torch.Generator().manual_seed(0)).images


def psnr(a, b):
    return float(10 * np.log10(1.0 / max(np.mean((a - b) ** 2), 1e-20)))


class Polynomial(torch.nn.Module):
    """A toy denoiser whose output is a polynomial in the step index; records the steps it really runs."""

    def __init__(self, context, coefficients):
        super().__init__()
        self.context, self.coefficients, self.ran = context, coefficients, []

    def forward(self, sample, timestep=None):
        s = self.context.step
        self.ran.append(s)
        return (sum(c * s**k for k, c in enumerate(self.coefficients)) * sample,)


@pytest.mark.parametrize(
    "order, coefficients, exact, full_steps",
    [
        (1, [1.0, 0.5], True, [0, 1, 4, 7, 10]),
        (2, [1.0, 0.5, -0.05], True, [0, 1, 2, 5, 8, 11]),
        (1, [1.0, 0.5, -0.05], False, [0, 1, 4, 7, 10]),
    ],
)
def test_polynomials_up_to_order_are_extrapolated_exactly(order, coefficients, exact, full_steps):
    context = StepContext(call_index=1, num_steps=12, cfg=True, branches=("uncond", "cond"))
    toy, truth = Polynomial(context, coefficients), Polynomial(context, coefficients)
    install_hook(toy, ForecastHook(context, order=order, interval=3, warmup=order + 1), "fastdiff.forecast")
    sample = torch.randn(4, 3)
    errors = []
    for step in range(12):
        context.step = step
        errors.append(float((toy(sample)[0] - truth(sample)[0]).abs().max()))
    assert toy.ran == full_steps  # the warm-up steps (order + 1 points), then every 3 steps
    if exact:
        assert max(errors) < 1e-4, errors
    else:  # a quadratic extrapolated linearly is off on the skipped steps only
        assert all((e > 1e-3) == (s not in toy.ran) for s, e in enumerate(errors)), errors


class Recorder(ModelHook):
    """Installed before forecast, so it runs only on real evaluations: records (step, branches, batch)."""

    def __init__(self, context):
        super().__init__()
        self.context, self.calls = context, []

    def pre_forward(self, module, *args, **kwargs):
        self.calls.append((self.context.step, self.context.branches, args[0].shape[0]))
        return args, kwargs


@pytest.mark.parametrize("guidance", [4.0, 1.0])
def test_nfe_drops_and_output_stays_close(fp, guidance):
    base = run(fp, guidance)
    for spec, nfe in (("forecast(order=1,interval=2)", 11), ("forecast(order=2,interval=3)", 8)):
        handle = fp.accelerate(spec)
        images = run(fp, guidance)
        assert fp.context.nfe == nfe, spec
        # Tolerance: PSNR >= 25 dB against the full 20-step output (measured 31-61 dB on these models).
        assert psnr(images, base) >= 25, (spec, psnr(images, base))
        assert not np.array_equal(images, base)
        np.testing.assert_array_equal(run(fp, guidance), images)  # history is cleared between calls
        handle.remove()
    np.testing.assert_array_equal(run(fp, guidance), base)


def test_interval_one_never_skips_and_apply_twice_is_once(fp):
    base = run(fp, steps=6)
    handle = fp.accelerate("forecast(order=2,interval=1)")
    again = fp.accelerate("forecast(order=2,interval=1)")
    assert len(fp.accelerators) == 2  # the scheduler and one forecast
    np.testing.assert_array_equal(run(fp, steps=6), base)
    assert fp.context.nfe == 6
    again.remove()
    handle.remove()


def test_composes_with_cfg_interval_per_branch(fp):
    # An empty guidance window runs the conditional branch alone at every step: exactly guidance off.
    fp.accelerate("forecast(order=1,interval=2)")
    unguided = run(fp, guidance=1.0)
    window = fp.accelerate("cfg-interval(start=0.0,end=0.0)")
    np.testing.assert_allclose(run(fp), unguided, atol=1e-6)
    window.remove()
    recorder = Recorder(fp.context)
    fp.remove_all()
    fp.accelerate("scheduler(name=dpm++2m)")
    inner = install_hook(fp.denoiser, recorder, "test.recorder")
    fp.accelerate("forecast(order=1,interval=2);cfg-interval(start=0.5,end=1.0)")
    try:
        images = run(fp)
    finally:
        inner.remove()
    layout = fp.context.cfg_layout
    real = {step: (branches, batch) for step, branches, batch in recorder.calls}
    assert real[0] == (("cond",), 2) and real[10] == (layout, 4)  # the uncond branch has no history at 10
    assert 11 not in real and fp.context.nfe == len(real) < STEPS
    assert np.isfinite(images).all()


def test_unsupported_model_bad_values_and_conflicts(pipes):
    class UnknownPipeline(DDPMPipeline):
        pass

    plain = make_pipeline("tiny-ddpm", "test")
    fp = FastPipeline(UnknownPipeline(unet=plain.unet, scheduler=plain.scheduler))
    with pytest.raises(UnsupportedModelError, match="no pipeline facts for UnknownPipeline"):
        fp.accelerate("forecast")
    assert fp.accelerators == ()
    with pytest.raises(AcceleratorError, match="choose one of 1, 2"):
        fastdiff.parse("forecast(order=3)")
    with pytest.raises(AcceleratorError, match="interval must be an integer >= 1, got 0"):
        fastdiff.parse("forecast(interval=0)")
    with pytest.raises(AcceleratorError, match="warmup must be an integer >= 1, got 0"):
        fastdiff.parse("forecast(warmup=0)")
    sd = FastPipeline(pipes["tiny-sd"])
    sd.accelerate("forecast")
    for other in [n for n in ("deepcache", "blockcache") if n in available()] + ["forecast(interval=3)"]:
        with pytest.raises(AcceleratorError, match="conflicts with"):
            sd.accelerate(other)
    sd.unwrap()
