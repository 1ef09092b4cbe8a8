"""Exact probability-flow ODE solutions of the Gaussian-mixture model, and the ODE error of a sampler.

With ``sigma = sqrt((1 - abar) / abar)`` and ``xbar = x_t / sqrt(abar)``, the probability-flow ODE that
diffusers' deterministic samplers discretise is ``d xbar / d sigma = E[eps | xbar]``. ``exact_samples`` solves
it with ``scipy.integrate.solve_ivp`` (DOP853, tight tolerances) from ``sigma_max`` (t = 999) to ``sigma_end``
(0 by default, where DDIM/PNDM with ``set_alpha_to_one``, Euler, Heun, DPM-Solver and UniPC end; DEIS ends
at the table's sigma_min = sigma(t=0) = 0.029 and returns x_0 there, so its error includes that last gap).

"Same initial noise" means the same standard normal draw ``z`` (the pipeline's ``randn_tensor`` output). The
exact solve starts at ``xbar = z * sqrt(1 + sigma_max^2)``, i.e. x_999 = z, where DDIM starts. (Euler/Heun
with trailing or linspace spacing start at ``xbar = z * sigma_max``: their ``init_noise_sigma`` omits the +1;
that offset is part of their error.)

Example::

    import torch
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler
    from fastdiff.zoo.gmm_exact import exact_samples, initial_noise, ode_error

    pipe = GMMPipeline(GMMDenoiser(), default_scheduler())
    z = initial_noise(pipe, batch_size=16, seed=0)
    exact = exact_samples(pipe, z)
    images = pipe(batch_size=16, num_inference_steps=10, output_type="pt", latents=z).images
    print(ode_error(images, exact))
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor
from scipy.integrate import solve_ivp

from fastdiff.eval.registry import register_quality
from fastdiff.schedulers.exact import ode_error, register_exact

# Per denoiser (VP or flow): {(seed, shape): exact samples}; weak keys free a discarded pipeline's cache.
_EXACT_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def find_denoiser(pipe, method: str, expected: str):
    """The module of ``pipe`` that has ``method``: ``pipe`` itself, or its ``.unet`` (unwrapped from
    torch.compile); otherwise TypeError saying ``pipe`` has no such denoiser (``expected``: what to pass)."""
    module = pipe if hasattr(pipe, method) else getattr(pipe, "unet", None)
    module = getattr(module, "_orig_mod", module)  # torch.compile wraps the module
    if not hasattr(module, method):
        raise TypeError(f"{type(pipe).__name__} has no {expected}")
    return module


def gmm_denoiser(pipe):
    """The ``GMMDenoiser`` of ``pipe`` (a GMMPipeline, a wrapper that forwards ``.unet``, or the denoiser)."""
    return find_denoiser(pipe, "epsilon_at_sigma", "GMMDenoiser (expected a GMMPipeline or a GMMDenoiser)")


def standard_noise(denoiser, batch_size: int, seed: int) -> torch.Tensor:
    """The float32 standard normal (batch_size, C, S, S) draw of ``torch.Generator().manual_seed(seed)``."""
    config = denoiser.config
    shape = (batch_size, config.in_channels, config.sample_size, config.sample_size)
    return randn_tensor(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def initial_noise(pipe, batch_size: int, seed: int) -> torch.Tensor:
    """The standard normal draw ``GMMPipeline`` makes with ``generator=torch.Generator().manual_seed(seed)``.

    >>> from fastdiff.zoo.gmm import GMMDenoiser
    >>> initial_noise(GMMDenoiser(), 3, seed=0).shape
    torch.Size([3, 1, 8, 8])
    """
    return standard_noise(gmm_denoiser(pipe), batch_size, seed)


def exact_samples(
    pipe,
    initial_noise: torch.Tensor,
    rtol: float = 1e-9,
    atol: float = 1e-9,
    sigma_end: float = 0.0,
    method: str = "DOP853",
    chunk_size: int = 128,
) -> torch.Tensor:
    """Solve the PF-ODE from ``initial_noise`` (standard normal z, (N, C, H, W)); float64 x at ``sigma_end``.

    At ``sigma_end=0`` the result is the clean sample x0; otherwise it is x_t = xbar / sqrt(1 + sigma_end^2).
    Samples are solved ``chunk_size`` at a time, each chunk as one system with shared step-size control
    (deterministic; a sample's result depends on its chunk only at the level of the tolerances).

    >>> from fastdiff.zoo.gmm import GMMDenoiser
    >>> den = GMMDenoiser()
    >>> exact_samples(den, torch.zeros(2, 1, 8, 8)).dtype
    torch.float64
    """
    denoiser = gmm_denoiser(pipe)
    if not 0 <= sigma_end < denoiser.sigma_max:
        raise ValueError(f"sigma_end={sigma_end} must be in [0, sigma_max={denoiser.sigma_max:.4f})")
    sigma_max = denoiser.sigma_max
    xbar_start = initial_noise.detach().double().cpu().flatten(1) * math.sqrt(1 + sigma_max**2)
    xbar_end = solve_chunked(
        denoiser.epsilon_at_sigma, xbar_start, (sigma_max, sigma_end), rtol, atol, method, chunk_size
    )
    return (xbar_end / math.sqrt(1 + sigma_end**2)).reshape(initial_noise.shape)


def solve_chunked(
    rhs,
    start: torch.Tensor,
    span: tuple[float, float],
    rtol: float,
    atol: float,
    method: str,
    chunk_size: int,
) -> torch.Tensor:
    """Solve ``dx/dt = rhs(x, t)`` over ``span`` from ``start`` (N, D) float64 CPU; x (N, D) at ``span[1]``.

    ``rhs`` maps a (rows, D) float64 tensor and a float time to (rows, D). Rows are solved ``chunk_size`` at a
    time, each chunk as one system with shared step-size control, with torch on one thread.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of small matmuls: extra threads cost more than they save
    try:
        # 128-sample chunks keep the solver's stage vectors in cache: measured ~4x less CPU than 1024 at once.
        chunks = [_solve_chunk(rhs, chunk, span, rtol, atol, method) for chunk in start.split(chunk_size)]
    finally:
        torch.set_num_threads(threads)
    return torch.cat(chunks)


def _solve_chunk(rhs, start: torch.Tensor, span: tuple[float, float], rtol, atol, method) -> torch.Tensor:
    rows = start.shape[0]

    @torch.no_grad()
    def derivative(t: float, flat: np.ndarray) -> np.ndarray:
        return rhs(torch.from_numpy(flat).view(rows, -1), t).numpy().ravel()

    solution = solve_ivp(
        derivative,
        span,
        start.numpy().ravel(),
        method=method,
        rtol=rtol,
        atol=atol,
        t_eval=[span[1]],
    )
    if not solution.success:
        raise RuntimeError(f"the exact ODE solve failed: {solution.message}")
    return torch.from_numpy(solution.y[:, -1].copy()).view(rows, -1)


@register_quality("GMMPipeline")
def gmm_quality(pipe, call_kwargs: dict, images, seed: int) -> dict[str, float]:
    """``{"ode_error": ...}`` of raw ``images`` against the exact solve from the noise of ``seed``.

    The noise is regenerated as the pipeline draws it from ``torch.Generator().manual_seed(seed)`` (or taken
    from ``call_kwargs["latents"]``); exact solutions are cached per denoiser by (seed, shape).
    """
    return cached_quality(gmm_denoiser(pipe), call_kwargs, images, seed, initial_noise, exact_samples)


def cached_quality(denoiser, call_kwargs: dict, images, seed: int, noise_of, solve) -> dict[str, float]:
    """``{"ode_error": ...}`` of ``images`` against ``solve(denoiser, z)``, z = ``call_kwargs["latents"]`` or
    else ``noise_of(denoiser, len(images), seed)``; solutions of the latter are cached per denoiser."""
    latents = call_kwargs.get("latents")
    if latents is not None:
        exact = solve(denoiser, latents)
    else:
        noise = noise_of(denoiser, len(images), seed)
        cache = _EXACT_CACHE.setdefault(denoiser, {})
        key = (seed, tuple(noise.shape))
        if key not in cache:
            cache[key] = solve(denoiser, noise)
        exact = cache[key]
    return {"ode_error": ode_error(images, exact)}


def _is_gmm(pipe) -> bool:
    try:
        gmm_denoiser(pipe)
    except TypeError:
        return False
    return True


@register_exact("noise", _is_gmm, "exact ODE solve (DOP853)")
def _exact_reference(pipe, batch: int, seed: int) -> torch.Tensor:
    # the schedule tuner's reference on the exact model: the solve from the noise the pipeline draws
    return exact_samples(pipe, initial_noise(pipe, batch, seed))
