"""Tests of the exact-score Gaussian-mixture model: closed-form denoiser, pipeline, exact solve, metric."""

from __future__ import annotations

import inspect

import diffusers
import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DEISMultistepScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    HeunDiscreteScheduler,
    LCMScheduler,
    PNDMScheduler,
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

from fastdiff.zoo import ZOO
from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, build_gmm, default_scheduler
from fastdiff.zoo.gmm_exact import exact_samples, gmm_quality, initial_noise, ode_error

SCHEDULERS = {
    "ddim": lambda cfg: DDIMScheduler.from_config(cfg),
    "ddpm": lambda cfg: DDPMScheduler.from_config(cfg),
    "pndm": lambda cfg: PNDMScheduler.from_config(cfg),
    "euler": lambda cfg: EulerDiscreteScheduler.from_config(cfg),
    "euler_ancestral": lambda cfg: EulerAncestralDiscreteScheduler.from_config(cfg),
    "heun": lambda cfg: HeunDiscreteScheduler.from_config(cfg),
    "dpm++2m": lambda cfg: DPMSolverMultistepScheduler.from_config(cfg),
    "dpm++2m_karras": lambda cfg: DPMSolverMultistepScheduler.from_config(cfg, use_karras_sigmas=True),
    "dpm++2m_sde": lambda cfg: DPMSolverMultistepScheduler.from_config(cfg, algorithm_type="sde-dpmsolver++"),
    "dpm_singlestep": lambda cfg: DPMSolverSinglestepScheduler.from_config(cfg),
    "unipc": lambda cfg: UniPCMultistepScheduler.from_config(cfg),
    "deis": lambda cfg: DEISMultistepScheduler.from_config(cfg),
    "lcm": lambda cfg: LCMScheduler.from_config(cfg),
}


@pytest.fixture(scope="module")
def pipe():
    pipeline = GMMPipeline(unet=GMMDenoiser(mixture_seed=0), scheduler=default_scheduler())
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.mark.parametrize("timestep", [20, 300, 650.5, 999])
def test_closed_form_epsilon_is_the_conditional_expectation(pipe, timestep):
    denoiser = pipe.unet
    generator = torch.Generator().manual_seed(1)
    x0 = sample_mixture(denoiser, 20_000, generator)
    eps = torch.randn(x0.shape, generator=generator, dtype=torch.float64)
    sigma = denoiser.timestep_to_sigma(timestep)
    alpha_bar = 1 / (1 + sigma**2)
    x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * eps
    as_image = x_t.reshape(-1, 1, 8, 8)
    exact = denoiser(as_image, timestep).sample.reshape(x0.shape)
    # A wrong denoiser (noise level 30% too low) must fail the same statistic: the test has power.
    wrong = denoiser(as_image, denoiser_timestep_for(denoiser, 0.7 * float(sigma))).sample.reshape(x0.shape)

    # 192 z-scores: |z| < 5 has false-alarm probability < 1e-4 over all of them (and the seed is fixed).
    assert orthogonality_z_scores(eps, exact, x_t).abs().max() < 5
    assert orthogonality_z_scores(eps, wrong, x_t).abs().max() > 10
    # The conditional expectation is the MMSE predictor.
    assert ((eps - exact) ** 2).mean() < ((eps - wrong) ** 2).mean()


def denoiser_timestep_for(denoiser: GMMDenoiser, sigma: float) -> float:
    # Inverse of timestep_to_sigma by bisection (the table is increasing); only the tests need it.
    low, high = 0.0, 999.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if float(denoiser.timestep_to_sigma(middle)) < sigma else (low, middle)
    return (low + high) / 2


def test_timestep_to_sigma_matches_the_schedulers(pipe):
    denoiser = pipe.unet
    euler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    # Schedulers keep sigmas in float32; the denoiser widens the same float32 alphas_cumprod to float64.
    table = ((1 - euler.alphas_cumprod) / euler.alphas_cumprod).sqrt().double()
    assert torch.allclose(denoiser.timestep_to_sigma(torch.arange(1000)), table, rtol=1e-6)
    # Karras sigmas reach the denoiser as fractional timesteps from log-sigma interpolation (_sigma_to_t).
    karras = EulerDiscreteScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)
    karras.set_timesteps(12)
    assert (karras.timesteps != karras.timesteps.round()).any()
    sigmas = denoiser.timestep_to_sigma(karras.timesteps)
    assert torch.allclose(sigmas, karras.sigmas[:-1].double(), rtol=1e-4)


def test_forward_dtype_and_per_sample_timesteps(pipe):
    assert_forward_dtype_and_per_sample_timesteps(pipe.unet, torch.tensor([10.0, 500.0, 999.0]))


def test_exact_solution_is_deterministic_and_has_the_mixture_statistics(pipe):
    noise = initial_noise(pipe, 512, seed=3)
    first = exact_samples(pipe, noise, rtol=1e-6, atol=1e-6)
    assert torch.equal(first, exact_samples(pipe, noise, rtol=1e-6, atol=1e-6))
    # Binomial SE is at most 0.022 at n=512; the noise is N(0, I), not exactly p_T, hence the small allowance.
    assert_mixture_statistics(first, pipe.unet.mixture())


def run_counted(pipe, scheduler, steps: int, batch: int, seed: int):
    """(images, number of denoiser calls) for one pipeline run."""
    pipe.scheduler = scheduler
    calls = []
    handle = pipe.unet.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        images = pipe(batch_size=batch, num_inference_steps=steps, generator=torch.Generator().manual_seed(seed))
    finally:
        handle.remove()
        pipe.scheduler = default_scheduler()
    return images.images, len(calls)


# Heun calls the denoiser 2 * steps - 1 times, so its step counts give NFE 5, 9, 19, 49.
STEPS_FOR_NFE = {"heun": (3, 5, 10, 25)}


@pytest.mark.parametrize("name", ["ddim", "dpm++2m", "unipc", "deis", "heun", "euler"])
def test_ode_error_decreases_with_nfe(pipe, name):
    noise = initial_noise(pipe, 64, seed=0)
    exact = exact_samples(pipe, noise)
    errors = []
    for steps in STEPS_FOR_NFE.get(name, (5, 10, 20, 50)):
        images, nfe = run_counted(pipe, SCHEDULERS[name](pipe.scheduler.config), steps, 64, seed=0)
        assert nfe == (2 * steps - 1 if name == "heun" else steps)
        errors.append(ode_error(images, exact))
    assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors


def state_before_last_step(denoiser, scheduler, steps: int, noise: torch.Tensor):
    """(sample, sigma) just before the scheduler's final step; the final jump to sigma=0 has its own error."""
    scheduler.set_timesteps(steps)
    sample = noise * scheduler.init_noise_sigma
    for t in scheduler.timesteps[:-1]:
        eps = denoiser(scheduler.scale_model_input(sample, t), t).sample
        sample = scheduler.step(eps, t, sample).prev_sample
    return sample, float(denoiser.timestep_to_sigma(scheduler.timesteps[-1]))


def test_high_nfe_converges_to_the_exact_solution(pipe):
    # Validates the noise and time mapping: a wrong start or sigma(t) would leave an O(1) error.
    noise = initial_noise(pipe, 64, seed=0)
    exact = exact_samples(pipe, noise)
    typical_norm = exact.flatten(1).norm(dim=1).mean()
    ddim, _ = run_counted(pipe, default_scheduler(), 999, 64, seed=0)
    assert ode_error(ddim, exact) < 0.01 * typical_norm
    # Every sampler ends with one first-order jump from sigma_min (0.029) to 0, so look just before it:
    # DPM++2M (Karras) is second order there, halving the step must cut the error about 4x.
    errors = []
    for steps in (50, 100):
        karras = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)
        sample, sigma = state_before_last_step(pipe.unet, karras, steps, noise)
        assert sigma == pytest.approx(pipe.unet.sigma_min, rel=1e-6)
        errors.append(ode_error(sample, exact_samples(pipe, noise, sigma_end=sigma)))
    assert errors[1] < 5e-4 * typical_norm
    assert errors[0] / errors[1] > 3, errors


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_runs(pipe, name):
    scheduler = SCHEDULERS[name](pipe.scheduler.config)
    images, nfe = run_counted(pipe, scheduler, 6, 4, seed=0)
    scheduler.set_timesteps(6)
    assert nfe == len(scheduler.timesteps)
    assert images.shape == (4, 8, 8, 1) and np.isfinite(images).all()
    assert images.std() > 0.1  # raw samples, not collapsed


def test_output_types_latents_and_errors(pipe):
    generator_images = pipe(batch_size=3, num_inference_steps=4, generator=torch.Generator().manual_seed(7)).images
    noise = initial_noise(pipe, 3, seed=7)
    as_tensor = pipe(batch_size=3, num_inference_steps=4, latents=noise, output_type="pt").images
    assert as_tensor.shape == (3, 1, 8, 8)
    np.testing.assert_array_equal(generator_images, as_tensor.permute(0, 2, 3, 1).numpy())
    assert isinstance(pipe(num_inference_steps=2, return_dict=False), tuple)
    with pytest.raises(ValueError, match="allowed: np, pt"):
        pipe(num_inference_steps=2, output_type="pil")
    with pytest.raises(ValueError, match=r"expected \(2, 1, 8, 8\)"):
        pipe(batch_size=2, num_inference_steps=2, latents=noise)


def test_quality_evaluator_matches_a_direct_exact_solve(pipe):
    assert_quality_matches_exact_solve(pipe, gmm_quality, exact_samples, initial_noise)


def test_save_load_round_trip_offline(tmp_path, monkeypatch, pipe):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hasattr(diffusers, "GMMPipeline")  # fastdiff leaves the diffusers namespace alone
    assert ZOO["gmm"] == (build_gmm, ("test", "bench"))
    loaded = assert_gmm_round_trip(pipe, build_gmm, tmp_path / "gmm", GMMPipeline, GMMDenoiser)
    assert isinstance(loaded.scheduler, DDIMScheduler)
    assert loaded.scheduler.config.timestep_spacing == "trailing" and loaded.scheduler.config.set_alpha_to_one
    assert "generator" in inspect.signature(loaded.__call__).parameters
