"""Tests of the exact-velocity flow-matching Gaussian mixture: closed form, time mapping, exact solve, metric."""

from __future__ import annotations

import diffusers
import numpy as np
import pytest
import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    UniPCMultistepScheduler,
)
from helpers import (
    assert_forward_dtype_and_per_sample_timesteps,
    assert_gmm_round_trip,
    assert_mixture_statistics,
    assert_quality_matches_exact_solve,
    orthogonality_z_scores,
    sample_mixture,
)

from fastdiff.eval import QUALITY
from fastdiff.zoo import ZOO
from fastdiff.zoo.gmm import GMMDenoiser
from fastdiff.zoo.gmm_flow import (
    GMMFlowDenoiser,
    GMMFlowPipeline,
    build_gmm_flow,
    default_scheduler,
    exact_samples,
    gmm_flow_quality,
    initial_noise,
    ode_error,
)

FLOW = dict(use_flow_sigmas=True, prediction_type="flow_prediction")
SCHEDULERS = {
    "euler": lambda shift=1.0: FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift),
    "dpm++2m": lambda shift=1.0: DPMSolverMultistepScheduler(**FLOW, flow_shift=shift),
    "unipc": lambda shift=1.0: UniPCMultistepScheduler(**FLOW, flow_shift=shift),
}


@pytest.fixture(scope="module")
def pipe():
    pipeline = GMMFlowPipeline(unet=GMMFlowDenoiser(mixture_seed=0), scheduler=default_scheduler())
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.fixture(scope="module")
def reference(pipe):
    noise = initial_noise(pipe, 64, seed=0)
    return noise, exact_samples(pipe, noise)


def run(pipe, scheduler, steps: int, noise: torch.Tensor) -> torch.Tensor:
    pipe.scheduler = scheduler
    try:
        return pipe(batch_size=len(noise), num_inference_steps=steps, output_type="pt", latents=noise).images
    finally:
        pipe.scheduler = default_scheduler()


def log_marginal(denoiser: GMMFlowDenoiser, x: torch.Tensor, s: float) -> torch.Tensor:
    mixture = denoiser.mixture()
    var = (1 - s) ** 2 * mixture["stds"] ** 2 + s**2
    diff = x[:, None] - (1 - s) * mixture["means"]
    log_normal = -0.5 * (diff**2 / var + var.log() + np.log(2 * np.pi)).sum(-1)
    return torch.logsumexp(log_normal + mixture["weights"].log(), dim=-1)


@pytest.mark.parametrize("s", [0.02, 0.3, 0.7, 0.98])
def test_velocity_is_the_score_identity_of_the_marginal(pipe, s):
    # Tweedie on x = (1-s) x0 + s eps: E[eps|x] = -s grad log p, (1-s) E[x0|x] = x + s^2 grad log p.
    denoiser = pipe.unet
    x = 1.5 * torch.randn(32, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x.requires_grad_(True)
    (score,) = torch.autograd.grad(log_marginal(denoiser, x, s).sum(), x)
    x = x.detach()
    expected = -s * score - (x + s**2 * score) / (1 - s)
    velocity = denoiser.velocity_at_sigma(x, s)
    torch.testing.assert_close(velocity, expected, rtol=1e-9, atol=1e-9)
    # v = (x - E[x0|x]) / s, and forward at t = 1000 s gives the same.
    torch.testing.assert_close(velocity, (x - denoiser.denoised_at_sigma(x, s)) / s, rtol=1e-9, atol=1e-9)
    out = denoiser(x.reshape(-1, 1, 8, 8), 1000 * s).sample.reshape(x.shape)
    torch.testing.assert_close(out, velocity, rtol=0, atol=1e-12)


def test_velocity_is_finite_at_both_ends(pipe):
    denoiser, mixture = pipe.unet, pipe.unet.mixture()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # s = 1: every component has marginal N(0, I), responsibilities are the weights, E[eps|x] = x.
    torch.testing.assert_close(denoiser.velocity_at_sigma(x, 1.0), x - mixture["weights"] @ mixture["means"])
    # s = 0: x is x0, E[eps|x] = 0.
    torch.testing.assert_close(denoiser.velocity_at_sigma(x, 0.0), -x)
    assert torch.equal(denoiser.means, GMMDenoiser(mixture_seed=0).means)  # the gmm mixture of the seed


@pytest.mark.parametrize("s", [0.1, 0.5, 0.9])
def test_velocity_is_the_conditional_expectation_monte_carlo(pipe, s):
    denoiser = pipe.unet
    generator = torch.Generator().manual_seed(1)
    x0 = sample_mixture(denoiser, 20_000, generator)
    eps = torch.randn(x0.shape, generator=generator, dtype=torch.float64)
    x = (1 - s) * x0 + s * eps
    exact = denoiser(x.reshape(-1, 1, 8, 8), 1000 * s).sample.reshape(x.shape)
    wrong = denoiser.velocity_at_sigma(x, 0.8 * s)  # the right formula at the wrong time: the test has power
    assert orthogonality_z_scores(eps - x0, exact, x).abs().max() < 5
    assert orthogonality_z_scores(eps - x0, wrong, x).abs().max() > 10


@pytest.mark.parametrize(
    "name, shift, tolerance",
    [("euler", 1.0, 1e-6), ("euler", 3.0, 1e-6), ("dpm++2m", 3.0, 1e-3), ("unipc", 1.0, 1e-3)],
)
def test_timesteps_map_back_to_the_schedulers_sigmas(pipe, name, shift, tolerance):
    # The schedulers pass t = sigma * 1000 after their own shift; DPM/UniPC truncate t to int64.
    scheduler = SCHEDULERS[name](shift)
    scheduler.set_timesteps(12)
    sigmas = pipe.unet.timestep_to_sigma(scheduler.timesteps)
    reference = scheduler.sigmas[:-1].double()
    assert (sigmas - reference).abs().max() < tolerance
    assert float(sigmas.max()) <= 1 and float(scheduler.sigmas[-1]) == 0
    dynamic = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    dynamic.set_timesteps(7, mu=0.8)
    torch.testing.assert_close(pipe.unet.timestep_to_sigma(dynamic.timesteps), dynamic.sigmas[:-1].double())


def test_forward_dtype_and_per_sample_timesteps(pipe):
    denoiser = pipe.unet
    x = assert_forward_dtype_and_per_sample_timesteps(denoiser, torch.tensor([0.0, 500.0, 1000.0]))
    with pytest.raises(ValueError, match="expected 1 or the batch size 3"):
        denoiser(x, torch.tensor([1.0, 2.0]))


def test_exact_solution_is_deterministic_and_has_the_mixture_statistics(pipe):
    noise = initial_noise(pipe, 512, seed=3)
    first = exact_samples(pipe, noise)
    assert torch.equal(first, exact_samples(pipe, noise))
    # Tolerances: a much tighter solve moves the answer by ~1e-10.
    assert ode_error(first, exact_samples(pipe, noise, rtol=1e-13, atol=1e-13)) < 1e-8
    # At s = 1 the marginal is exactly N(0, I), so the ODE transports z to the mixture: binomial SE <= 0.022.
    assert_mixture_statistics(first, pipe.unet.mixture())


def test_euler_ode_error_falls_at_first_order(pipe, reference):
    noise, exact = reference
    errors = [ode_error(run(pipe, SCHEDULERS["euler"](), n, noise), exact) for n in (4, 8, 16, 32, 128)]
    assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors
    # Measured 1.358, 0.592, 0.289, 0.144, 0.036: halving the step halves the error.
    for earlier, later in zip(errors[1:4], errors[2:4]):
        assert 1.7 < earlier / later < 2.3, errors
    assert 3.5 < errors[3] / errors[4] < 4.5, errors  # 4x the steps, 4x less error
    assert errors[4] < 0.01 * float(exact.flatten(1).norm(dim=1).mean())


@pytest.mark.parametrize("name", ["dpm++2m", "unipc"])
def test_multistep_flow_solvers_beat_euler_at_equal_nfe(pipe, reference, name):
    noise, exact = reference
    for steps in (4, 8, 16, 28):
        calls = []
        handle = pipe.unet.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(1))
        try:
            error = ode_error(run(pipe, SCHEDULERS[name](), steps, noise), exact)
        finally:
            handle.remove()
        euler = ode_error(run(pipe, SCHEDULERS["euler"](), steps, noise), exact)
        assert len(calls) == steps
        # Measured at 16 NFE: Euler 0.289, DPM++2M 0.074, UniPC 0.069.
        assert error < (0.3 if steps >= 16 else 0.75) * euler, (steps, error, euler)


def test_output_types_latents_and_errors(pipe):
    kwargs = dict(batch_size=3, num_inference_steps=4)
    generator_images = pipe(**kwargs, generator=torch.Generator().manual_seed(7)).images
    noise = initial_noise(pipe, 3, seed=7)
    as_tensor = pipe(**kwargs, latents=noise, output_type="pt").images
    np.testing.assert_array_equal(generator_images, as_tensor.permute(0, 2, 3, 1).numpy())
    with pytest.raises(ValueError, match="allowed: np, pt"):
        pipe(num_inference_steps=2, output_type="pil")
    with pytest.raises(ValueError, match=r"expected \(2, 1, 8, 8\)"):
        pipe(batch_size=2, num_inference_steps=2, latents=noise)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    try:
        assert pipe(batch_size=2, num_inference_steps=3, mu=0.5, output_type="pt").images.isfinite().all()
    finally:
        pipe.scheduler = default_scheduler()


def test_quality_evaluator_matches_a_direct_exact_solve(pipe):
    assert QUALITY["GMMFlowPipeline"] is gmm_flow_quality
    assert_quality_matches_exact_solve(pipe, gmm_flow_quality, exact_samples, initial_noise)


def test_save_load_round_trip_offline(tmp_path, monkeypatch, pipe):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hasattr(diffusers, "GMMFlowPipeline")
    assert ZOO["gmm-flow"] == (build_gmm_flow, ("test", "bench"))
    loaded = assert_gmm_round_trip(pipe, build_gmm_flow, tmp_path / "gmm-flow", GMMFlowPipeline, GMMFlowDenoiser)
    assert isinstance(loaded.scheduler, FlowMatchEulerDiscreteScheduler) and loaded.scheduler.config.shift == 1.0
