"""forecast: skipped denoiser calls predicted by polynomial extrapolation of the last full outputs."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline
from diffusers.hooks import ModelHook
from helpers import call, psnr, tiny_pipe

import fastdiff
from fastdiff import AcceleratorError, FastPipeline
from fastdiff.cache.forecast import MAX_GAIN, ForecastHook, _stable_fit, _weights
from fastdiff.core.branch_state import BranchStore
from fastdiff.core.context import StepContext
from fastdiff.core.hooks import install_hook
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.registry import available
from fastdiff.eval.compat import module_state, state_differences
from fastdiff.zoo.tiny import make_pipeline

STEPS = 20


@pytest.fixture(params=["tiny-sd", "tiny-dit"])
def fp(request, pipes):
    wrapped = FastPipeline(pipes[request.param])
    wrapped.accelerate("scheduler(name=dpm++2m)")
    yield wrapped
    wrapped.unwrap()


run = functools.partial(call, steps=STEPS, guidance=4.0)


class Polynomial(torch.nn.Module):
    """A toy denoiser whose output is a polynomial in the step index; records the steps it really runs."""

    def __init__(self, context, coefficients):
        super().__init__()
        self.context, self.coefficients, self.ran = context, coefficients, []

    def forward(self, sample, timestep=None):
        s = self.context.step
        self.ran.append(s)
        return (sum(c * s**k for k, c in enumerate(self.coefficients)) * sample,)


def test_weights_reproduce_polynomials_and_gain_caps_the_reach():
    quadratic = [1.0 + 0.5 * s - 0.05 * s * s for s in range(12)]
    for xs, x in (([2, 5, 8], 9), ([0, 1, 2], 3), ([1, 4, 7], 11)):
        value = sum(w * quadratic[i] for w, i in zip(_weights(xs, x), xs))
        assert value == pytest.approx(quadratic[x], abs=1e-9)
    points = [(s, None) for s in (0, 1, 2)]
    assert [s for s, _ in _stable_fit(points, 3)[0]] == [1, 2]  # quadratic 1 ahead: gain 7 -> a line, 3
    assert [s for s, _ in _stable_fit(points, 4)[0]] == [2]  # a line 2 ahead: gain 5 -> reuse the last
    assert [s for s, _ in _stable_fit([(2, None), (5, None), (8, None)], 9)[0]] == [2, 5, 8]  # gain 2.56
    assert MAX_GAIN == 3


@pytest.mark.parametrize(
    "order, coefficients, interval, full, exact",
    [
        # A line, order 1, interval 2: every prediction is a line at most one spacing ahead: all exact.
        (1, [1.0, 0.5], 2, [0, 1, 3, 5, 7, 9, 11], range(12)),
        # A quadratic, order 2, interval 3: the quadratic through (1, 4, 7) / (4, 7, 10) is used one step
        # ahead (8, 11); other skipped steps fall back to a line or to reuse, which a quadratic defeats.
        (2, [1.0, 0.5, -0.05], 3, [0, 1, 4, 7, 10], [0, 1, 4, 7, 8, 10, 11]),
        # The same quadratic with order 1: only the full steps are exact.
        (1, [1.0, 0.5, -0.05], 3, [0, 1, 4, 7, 10], [0, 1, 4, 7, 10]),
    ],
)
def test_hook_runs_the_schedule_and_extrapolates(order, coefficients, interval, full, exact):
    context = StepContext(call_index=1, num_steps=12, cfg=True, branches=("uncond", "cond"))
    toy, truth = Polynomial(context, coefficients), Polynomial(context, coefficients)
    install_hook(toy, ForecastHook(context, order=order, interval=interval, warmup=2), "fastdiff.forecast")
    sample = torch.randn(4, 3)
    for step in range(12):
        context.step = step
        error = float((toy(sample)[0] - truth(sample)[0]).abs().max())
        assert (error < 1e-4) == (step in exact), (step, error)
    assert toy.ran == full  # real evaluations: the warm-up steps, then every `interval` steps


def test_after_warmup_moves_the_first_full_step_as_diffusers_taylorseer_does():
    # diffusers' TaylorSeer (cache_interval 3, disable_cache_before_step 3) computes 0, 1, 2, 4, 7, ..., 25 of 28
    context = StepContext(call_index=1, num_steps=28, cfg=False, branches=("cond",))
    toy = Polynomial(context, [1.0, 0.5])
    hook = ForecastHook(context, order=1, interval=3, warmup=3, first_gap=2)
    install_hook(toy, hook, "fastdiff.forecast")
    for step in range(28):
        context.step = step
        toy(torch.ones(1, 2))
    assert toy.ran == [0, 1, 2] + list(range(4, 28, 3))
    with pytest.raises(AcceleratorError, match="after_warmup must be an integer from 0 to interval - 1 = 2, got 3"):
        fastdiff.parse("forecast(interval=3,after_warmup=3)")


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
    base = run(fp, guidance=guidance)
    for spec, nfe in (("forecast(order=1,interval=2)", 11), ("forecast(order=2,interval=3)", 8)):
        handle = fp.accelerate(spec)
        images = run(fp, guidance=guidance)
        assert fp.context.nfe == nfe, spec
        # Tolerance: PSNR >= 25 dB against the full 20-step output (measured 31-61 dB on these models).
        assert psnr(images, base, floor=1e-20) >= 25, (spec, psnr(images, base, floor=1e-20))
        assert not np.array_equal(images, base)
        np.testing.assert_array_equal(run(fp, guidance=guidance), images)  # history is cleared between calls
        handle.remove()
    np.testing.assert_array_equal(run(fp, guidance=guidance), base)


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


def test_attention_forecast_runs_every_call_but_predicts_attention(pipes):
    fp = FastPipeline(tiny_pipe("tiny-sd3"))
    base = call(fp, steps=12, guidance=4.0)
    state = module_state(fp.pipe)
    handle = fp.accelerate("forecast(interval=3,warmup=3,at=attention)")
    from benchmarks.flow_caching import Count

    counters, counting = {}, []  # on a layer inside each attention module: forecast's hook sits on the module
    for name, module in fp.denoiser.named_modules():
        if name.endswith(".attn.to_q"):
            counters[name] = Count()
            counting.append(install_hook(module, counters[name], "test.counter"))
    images = call(fp, steps=12, guidance=4.0)
    for h in counting:
        h.remove()
    assert fp.context.nfe == 12  # the denoiser runs at every step (CFG batched: one call per step)
    assert len(counters) == 2 and all(c.calls == 6 for c in counters.values())  # steps 0, 1, 2, 5, 8, 11
    assert psnr(images, base, floor=1e-20) >= 25 and not np.array_equal(images, base)
    np.testing.assert_array_equal(call(fp, steps=12, guidance=4.0), images)
    handle.remove()
    np.testing.assert_array_equal(call(fp, steps=12, guidance=4.0), base)
    assert not state_differences(state, module_state(fp.pipe))  # no hook registry or instance forward left
    unet = FastPipeline(pipes["tiny-sd"])
    with pytest.raises(UnsupportedModelError, match="needs a transformer denoiser; UNet2DConditionModel is a unet"):
        unet.accelerate("forecast(at=attention)")
    assert unet.accelerators == ()
    with pytest.raises(AcceleratorError, match="choose one of output, attention"):
        fastdiff.parse("forecast(at=blocks)")


def test_attention_forecast_gives_diffusers_taylorseer_images_on_sd3(monkeypatch):
    # forecast(at=attention,after_warmup=1) is diffusers' TaylorSeer (TaylorSeerCacheConfig, hooks on every block's
    # attention) at cache_interval=interval, disable_cache_before_step=warmup, max_order=order; the diffusers side
    # is the benchmark's own setting "hf-taylorseer:INTERVAL:WARMUP:ORDER".
    from benchmarks import flow_caching as bench

    monkeypatch.setattr(bench, "STEPS", 12)
    monkeypatch.setattr(bench, "GUIDANCE", {"scale": 4.0})
    fp = FastPipeline(tiny_pipe("tiny-sd3"))
    prompts = ["a red fox", "a blue car"]
    names = [name for name, _ in fp.denoiser.named_modules() if name.endswith(".attn.to_q")]
    computed: dict[str, list[int]] = {}  # attention -> steps it computed: a forecast one never calls its to_q
    hooks = [
        fp.denoiser.get_submodule(name).register_forward_pre_hook(
            lambda *_, name=name: computed[name].append(fp.context.step)
        )
        for name in names
    ]

    def run(text):
        computed.update((name, []) for name in names)
        images, _, calls = bench.run(fp, bench.setting(text), prompts)
        assert calls == len(computed[names[-1]])  # the benchmark's count of the last block's attention
        return images, dict(computed)

    plain, plain_steps = run("none")
    ours, our_steps = run("forecast(order=1,interval=3,warmup=3,at=attention,after_warmup=1)")
    theirs, their_steps = run("hf-taylorseer:3:3:1")
    for hook in hooks:
        hook.remove()
    assert len(plain_steps) == 2 and all(s == list(range(12)) for s in plain_steps.values())
    # warm-up 0-2, then every third step from 4: 6 of the 12 steps forecast, in both attention layers
    assert our_steps == their_steps == dict.fromkeys(plain_steps, [0, 1, 2, 4, 7, 10])
    # The same extrapolation (Lagrange weights here, Taylor differences there) rounds differently: 1.2e-6 apart
    # measured. Forecasting changes the images by 2.1e-4, and order 2 or the default after_warmup by >= 5e-5.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    assert np.abs(ours - plain).max() > 1e-4
    np.testing.assert_array_equal(bench.run(fp, bench.setting("none"), prompts)[0], plain)  # all removed


def test_whole_batch_prediction_equals_the_per_branch_one(monkeypatch):
    # Forecast fits a CFG batch in one go when both branches were stored together; per branch it must agree bit
    # for bit, and a step that runs one branch alone parts the histories (then it goes branch by branch).
    original, whole_fits = BranchStore.joined_points, []

    def spy(self, branches):
        found = original(self, branches)
        whole_fits.append(found is not None)
        return found

    def predictions(joined: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(BranchStore, "joined_points", spy if joined else lambda self, branches: None)
        context = StepContext(call_index=1, num_steps=12, cfg=True, branches=("uncond", "cond"))
        toy = Polynomial(context, [1.0, 0.5, -0.05])
        install_hook(toy, ForecastHook(context, order=2, interval=2, warmup=3), "fastdiff.forecast")
        sample, out = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), []
        for step in range(12):
            context.step = step
            both = step != 5
            context.branches = ("uncond", "cond") if both else ("cond",)
            out.append(toy(sample if both else sample[2:])[0])
        monkeypatch.undo()
        return out

    for whole, per_branch in zip(predictions(True), predictions(False), strict=True):
        assert torch.equal(whole, per_branch)
    assert any(whole_fits) and not all(whole_fits)  # both paths were taken
