"""The exact-velocity model: the Gaussian mixture under the flow-matching (rectified-flow) path.

The same mixture as ``fastdiff.zoo.gmm`` (``make_mixture``, same seed, same mixture), noised on the straight
path of SD3, Flux and diffusers' flow schedulers::

    x_s = (1 - s) x0 + s eps,   s in [0, 1],   model output v = eps - x0,   timestep t = s * 1000.

Exact velocity. Per component k and dimension, (x0, eps, x_s) are jointly Gaussian with
``V_k = Var(x_s | k) = (1 - s)^2 S_k^2 + s^2``, ``Cov(x0, x_s) = (1 - s) S_k^2``, ``Cov(eps, x_s) = s``, so
with ``d_k = x_s - (1 - s) mu_k``::

    E[x0 | x_s, k] = mu_k + (1 - s) S_k^2 d_k / V_k,    E[eps | x_s, k] = s d_k / V_k,
    E[v | x_s, k]  = (s - (1 - s) S_k^2) d_k / V_k - mu_k,

weighted by the responsibilities under ``N((1 - s) mu_k, V_k)``. ``V_k >= S_k^2 / (1 + S_k^2) > 0`` on all of
[0, 1], so the form is finite at both ends: ``v = z - sum_k w_k mu_k`` at s = 1, ``v = -x0`` at s = 0. (It
satisfies ``v = (x_s - E[x0 | x_s]) / s`` and ``E[eps | x_s] = -s grad log p_s(x_s)``; the tests check both.)

Timesteps. Every flow scheduler places its sigmas (with whatever ``shift`` / ``flow_shift``, dynamic ``mu``,
Karras or terminal stretch) and hands the model ``t = sigma * num_train_timesteps``, so the model maps back
with ``sigma = t / num_train_timesteps`` and never applies a shift itself. FlowMatchEuler passes that float;
DPMSolverMultistep / UniPC with ``use_flow_sigmas`` pass it truncated to int64 while stepping with the float
sigma, a (diffusers) mismatch of up to 1e-3 in s that is part of their measured error, as is DPM-Solver's
start at s = 0.999 instead of 1.

Exact solutions: ``exact_samples`` integrates ``dx/ds = E[v | x, s]`` from s = 1 (x = z, the pipeline's
standard normal draw) to s = 0 with DOP853; ``fastdiff bench`` gets ``ode_error`` through the evaluator
registered for ``GMMFlowPipeline``.

Example::

    import torch
    from diffusers import DPMSolverMultistepScheduler
    from fastdiff.zoo.gmm_flow import GMMFlowDenoiser, GMMFlowPipeline, default_scheduler
    from fastdiff.zoo.gmm_flow import exact_samples, initial_noise, ode_error

    pipe = GMMFlowPipeline(unet=GMMFlowDenoiser(mixture_seed=0), scheduler=default_scheduler())
    z = initial_noise(pipe, batch_size=16, seed=0)
    exact = exact_samples(pipe, z)
    euler = pipe(batch_size=16, num_inference_steps=8, output_type="pt", latents=z).images
    pipe.scheduler = DPMSolverMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=1.0
    )
    dpm = pipe(batch_size=16, num_inference_steps=8, output_type="pt", latents=z).images
    print(ode_error(euler, exact), ode_error(dpm, exact))
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.configuration_utils import register_to_config

# Imported for DiffusionPipeline.from_pretrained, which finds a component's load method by looking its base
# classes up by name (ModelMixin) in the module model_index.json names, this one.
from diffusers.models.modeling_utils import ModelMixin  # noqa: F401
from diffusers.models.unets.unet_2d import UNet2DOutput

from fastdiff.core.models import PipelineFacts, register_pipeline
from fastdiff.eval.registry import register_quality
from fastdiff.schedulers.exact import register_exact
from fastdiff.zoo.gmm import GMMPipeline, MixtureDenoiser
from fastdiff.zoo.gmm_exact import cached_quality, find_denoiser, ode_error, solve_chunked, standard_noise
from fastdiff.zoo.registry import register_model


class GMMFlowDenoiser(MixtureDenoiser):
    """Exact velocity E[eps - x0 | x_s] of a diagonal Gaussian mixture; a drop-in for a ``UNet2DModel``.

    Same float64 buffers as ``GMMDenoiser`` (``means``, ``stds``, ``log_weights``, from ``mixture_seed``); all
    maths in float64, output in the input's dtype.

    >>> den = GMMFlowDenoiser(mixture_seed=0)
    >>> den(torch.zeros(2, 1, 8, 8), 1000.0).sample.shape
    torch.Size([2, 1, 8, 8])
    """

    @register_to_config
    def __init__(
        self,
        sample_size: int = 8,
        in_channels: int = 1,
        out_channels: int = 1,
        num_components: int = 6,
        mixture_seed: int = 0,
        mean_scale: float = 0.6,
        std_min: float = 0.1,
        std_max: float = 0.5,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        self._init_mixture(
            sample_size, in_channels, out_channels, num_components, mixture_seed, mean_scale, std_min, std_max
        )
        if num_train_timesteps < 1:
            raise ValueError(f"num_train_timesteps={num_train_timesteps} must be >= 1")

    def timestep_to_sigma(self, timestep) -> torch.Tensor:
        """Float64 s = t / num_train_timesteps, clamped to [0, 1] (the schedulers' t = sigma * 1000).

        >>> float(GMMFlowDenoiser().timestep_to_sigma(250))
        0.25
        """
        t = torch.as_tensor(timestep, dtype=torch.float64).cpu()
        return (t / self.config.num_train_timesteps).clamp(0, 1)

    def velocity_at_sigma(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """E[v | x_s = x] for ``x`` (B, D) float64 at s = ``sigma`` (scalar or (B,)); bypasses ``forward``."""
        return self._each_sigma(x, sigma, partial(self._one_sigma, velocity=True))

    def denoised_at_sigma(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """E[x0 | x_s = x] for ``x`` (B, D) float64 at s = ``sigma`` (scalar or (B,))."""
        return self._each_sigma(x, sigma, partial(self._one_sigma, velocity=False))

    def _one_sigma(self, x: torch.Tensor, s: float, velocity: bool) -> torch.Tensor:
        means, stds, log_weights = self._float64_mixture(x.device)
        if not 0 <= s <= 1:
            raise ValueError(f"sigma={s} must be in [0, 1]")
        inv_var = 1 / ((1 - s) ** 2 * stds**2 + s**2)  # (K, D), bounded: V >= S^2 / (1 + S^2)
        centers = (1 - s) * means
        r, _ = self._responsibilities(x, centers, inv_var, log_weights)
        # gain * d_k / V_k with d_k = x - (1-s) mu_k; velocity: gain = s - (1-s) S^2, offset -mu_k;
        # denoised: gain = (1-s) S^2, offset +mu_k.
        gain = (s - (1 - s) * stds**2) if velocity else (1 - s) * stds**2
        gain = gain * inv_var
        offset = r @ means
        result = x * (r @ gain) - r @ (gain * centers)
        return result - offset if velocity else result + offset

    def forward(self, sample: torch.Tensor, timestep, return_dict: bool = True, **ignored_unet_kwargs):
        """Exact E[v | x_s] for ``sample`` = x_s (B, C, H, W) at ``timestep`` (number, 0-d or (B,) tensor).

        Other ``UNet2DModel`` keyword arguments (``class_labels``, ...) are accepted and ignored.
        """
        batch = sample.shape[0]
        sigma = self._batch_sigma(timestep, batch)
        x = sample.reshape(batch, -1).double()
        v = self.velocity_at_sigma(x, sigma.expand(batch) if sigma.numel() > 1 else sigma)
        v = v.reshape(sample.shape).to(sample.dtype)
        return UNet2DOutput(sample=v) if return_dict else (v,)


def default_scheduler(shift: float = 1.0) -> FlowMatchEulerDiscreteScheduler:
    """The scheduler saved with the pipeline: flow-matching Euler, 1000 train steps, ``shift=1`` (uniform s).

    A shift > 1 (SD3 uses 3) spends steps at high noise, where this 64-dim mixture bends least, and leaves few
    for s < 0.3, where it bends most. Measured on 64 samples: with shift 3 Euler's ODE error is 1.5-2.2x higher
    at every NFE from 4 to 256 (16 NFE: 0.29 unshifted, 0.57 shifted), DPM-Solver++ 2M's and UniPC's up to 7x
    (28 NFE), so the unshifted path is the default.
    """
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)


@register_pipeline(PipelineFacts("batch_size", default_batch=256))
class GMMFlowPipeline(GMMPipeline):
    """``GMMPipeline`` for flow schedulers: the start is z itself and the model output is a velocity.

    A subclass, not ``GMMPipeline`` itself, because FlowMatchEulerDiscreteScheduler has neither
    ``init_noise_sigma`` nor ``scale_model_input`` (both identities for flow schedulers here), because flow
    schedulers with ``use_dynamic_shifting`` need ``mu`` in ``set_timesteps``, and because quality evaluators
    are looked up by pipeline class name (``ode_error`` against the flow ODE, not the VP one).

    >>> pipe = GMMFlowPipeline(GMMFlowDenoiser(), default_scheduler())
    >>> pipe(batch_size=2, num_inference_steps=5, output_type="pt").images.shape
    torch.Size([2, 1, 8, 8])
    """

    def __init__(self, unet: GMMFlowDenoiser, scheduler):
        super().__init__(unet=unet, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 50,
        generator=None,
        output_type: str = "np",
        return_dict: bool = True,
        latents: torch.Tensor | None = None,
        mu: float | None = None,
    ):
        device, latents = self._start_latents(batch_size, generator, output_type, latents)
        scheduler = self.scheduler
        extra = {"mu": mu} if mu is not None else {}
        scheduler.set_timesteps(num_inference_steps, device=device, **extra)
        latents = latents * getattr(scheduler, "init_noise_sigma", 1.0)
        scale = getattr(scheduler, "scale_model_input", lambda sample, t: sample)
        step_kwargs = self._step_kwargs(generator)
        for t in self.progress_bar(scheduler.timesteps):
            velocity = self.unet(scale(latents, t), t).sample
            latents = scheduler.step(velocity, t, latents, **step_kwargs).prev_sample
        return self._finish(latents, output_type, return_dict)


@register_model("gmm-flow", sizes=("test", "bench"))
def build_gmm_flow(out_dir: Path, size: str, seed: int) -> None:
    """Write a GMMFlowPipeline (the ``gmm`` mixture of ``seed``, FlowMatchEuler shift 1); sizes are identical."""
    pipe = GMMFlowPipeline(unet=GMMFlowDenoiser(mixture_seed=seed), scheduler=default_scheduler())
    pipe.save_pretrained(str(out_dir))


# -- exact solutions and the ODE error ----------------------------------------------------------------------


def flow_denoiser(pipe) -> GMMFlowDenoiser:
    """The ``GMMFlowDenoiser`` of ``pipe`` (a GMMFlowPipeline, a wrapper forwarding ``.unet``, or itself)."""
    return find_denoiser(pipe, "velocity_at_sigma", "GMMFlowDenoiser (expected a GMMFlowPipeline)")


def initial_noise(pipe, batch_size: int, seed: int) -> torch.Tensor:
    """The standard normal draw ``GMMFlowPipeline`` makes with ``torch.Generator().manual_seed(seed)``."""
    return standard_noise(flow_denoiser(pipe), batch_size, seed)


def exact_samples(
    pipe,
    initial_noise: torch.Tensor,
    rtol: float = 1e-10,
    atol: float = 1e-10,
    sigma_end: float = 0.0,
    method: str = "DOP853",
    chunk_size: int = 128,
) -> torch.Tensor:
    """Solve dx/ds = E[v | x, s] from s = 1, x = ``initial_noise`` (N, C, H, W) to ``sigma_end``; float64 x.

    Samples are solved ``chunk_size`` at a time, each chunk as one system with shared step-size control.

    >>> exact_samples(GMMFlowDenoiser(), torch.zeros(2, 1, 8, 8)).dtype
    torch.float64
    """
    denoiser = flow_denoiser(pipe)
    if not 0 <= sigma_end < 1:
        raise ValueError(f"sigma_end={sigma_end} must be in [0, 1)")
    start = initial_noise.detach().double().cpu().flatten(1)
    end = solve_chunked(denoiser.velocity_at_sigma, start, (1.0, sigma_end), rtol, atol, method, chunk_size)
    return end.reshape(initial_noise.shape)


@register_quality("GMMFlowPipeline")
def gmm_flow_quality(pipe, call_kwargs: dict, images, seed: int) -> dict[str, float]:
    """``{"ode_error": ...}`` of raw ``images`` against the exact flow solve from the noise of ``seed``.

    The noise is regenerated as the pipeline draws it (or taken from ``call_kwargs["latents"]``); exact
    solutions are cached per denoiser by (seed, shape).
    """
    return cached_quality(flow_denoiser(pipe), call_kwargs, images, seed, initial_noise, exact_samples)


def _is_gmm_flow(pipe) -> bool:
    try:
        flow_denoiser(pipe)
    except TypeError:
        return False
    return True


@register_exact("flow", _is_gmm_flow, "exact flow ODE solve (DOP853)")
def _exact_reference(pipe, batch: int, seed: int) -> torch.Tensor:
    # the schedule tuner's reference on gmm-flow: the exact solve from the noise the pipeline draws
    return exact_samples(pipe, initial_noise(pipe, batch, seed))


__all__ = [
    "GMMFlowDenoiser",
    "GMMFlowPipeline",
    "build_gmm_flow",
    "default_scheduler",
    "exact_samples",
    "flow_denoiser",
    "gmm_flow_quality",
    "initial_noise",
    "ode_error",
]
