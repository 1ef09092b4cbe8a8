"""The exact-score model: a Gaussian mixture whose denoiser E[eps | x_t] is known in closed form.

Data x0 ~ sum_k w_k N(mu_k, diag(s_k^2)) in an image-shaped space (1x8x8 = 64 dims). Under the VP process
x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps the optimal epsilon prediction is exact, so a sampler's error can
be measured against the exact probability-flow ODE solution (``fastdiff.zoo.gmm_exact``) without any learned
metric.

Parametrisation used throughout (the one diffusers' sigma-based schedulers use):
``sigma = sqrt((1 - abar) / abar)`` and ``xbar = x_t / sqrt(abar) = x0 + sigma * eps``. Per component,
``E[eps | xbar, k] = sigma * (xbar - mu_k) / (s_k^2 + sigma^2)``; components are weighted by their posterior
responsibilities under ``N(mu_k, s_k^2 + sigma^2)``. This form has no division by sigma, so it is finite at 0.

Timesteps: a real-valued ``t`` in [0, num_train_timesteps - 1] maps to sigma by *linear interpolation of
log-sigma* over the integer DDPM table, the exact inverse of diffusers' ``_sigma_to_t`` (Euler, Heun,
DPM-Solver with Karras sigmas); at integer ``t`` it is the table value, which every scheduler uses.

Example::

    import torch
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    pipe = GMMPipeline(unet=GMMDenoiser(mixture_seed=0), scheduler=default_scheduler())
    out = pipe(batch_size=4, num_inference_steps=20, generator=torch.Generator().manual_seed(0))
    out.images.shape  # (4, 8, 8, 1), raw samples (not clipped, not rescaled)
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline, ImagePipelineOutput
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.unets.unet_2d import UNet2DOutput
from diffusers.utils.torch_utils import randn_tensor

from fastdiff.core.models import PipelineFacts, register_pipeline
from fastdiff.zoo.registry import register_model

# The DDPM noise schedule of Stable Diffusion; the denoiser and the saved scheduler share it.
SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
OUTPUT_TYPES = ("np", "pt")


def make_mixture(
    seed: int,
    num_components: int = 6,
    dims: int = 64,
    mean_scale: float = 0.6,
    std_range: tuple[float, float] = (0.1, 0.5),
) -> dict[str, torch.Tensor]:
    """A random diagonal Gaussian mixture fixed by ``seed``: float64 ``means``, ``stds``, ``weights``.

    Means ~ N(0, mean_scale^2) per dimension, stds log-uniform in ``std_range``, weights softmax(0.5 N(0,1)).
    The smallest std sets how sharply the ODE bends near sigma=0, i.e. how much the final steps matter.

    >>> m = make_mixture(0); m["means"].shape, round(float(m["weights"].sum()), 6)
    (torch.Size([6, 64]), 1.0)
    """
    if num_components < 1 or dims < 1:
        raise ValueError(f"num_components={num_components} and dims={dims} must both be >= 1")
    low, high = std_range
    if not 0 < low <= high:
        raise ValueError(f"std_range={std_range} must satisfy 0 < low <= high")
    rng = torch.Generator().manual_seed(seed)
    means = mean_scale * torch.randn(num_components, dims, generator=rng, dtype=torch.float64)
    unit = torch.rand(num_components, dims, generator=rng, dtype=torch.float64)
    stds = torch.exp(math.log(low) + unit * (math.log(high) - math.log(low)))
    weights = torch.softmax(0.5 * torch.randn(num_components, generator=rng, dtype=torch.float64), dim=0)
    return {"means": means, "stds": stds, "weights": weights}


class MixtureDenoiser(ModelMixin, ConfigMixin):
    """What the exact mixture denoisers share: the float64 mixture buffers and the per-noise-level batching.

    Subclasses (``GMMDenoiser``, ``fastdiff.zoo.gmm_flow.GMMFlowDenoiser``) call ``_init_mixture`` from their
    ``register_to_config`` constructors and build their closed forms on ``_responsibilities``.
    """

    def _init_mixture(
        self,
        sample_size: int,
        in_channels: int,
        out_channels: int,
        num_components: int,
        mixture_seed: int,
        mean_scale: float,
        std_min: float,
        std_max: float,
    ) -> None:
        if out_channels != in_channels:
            raise ValueError(f"out_channels={out_channels} must equal in_channels={in_channels}")
        dims = in_channels * sample_size * sample_size
        mixture = make_mixture(mixture_seed, num_components, dims, mean_scale, (std_min, std_max))
        self.register_buffer("means", mixture["means"])
        self.register_buffer("stds", mixture["stds"])
        self.register_buffer("log_weights", mixture["weights"].log())

    def mixture(self) -> dict[str, torch.Tensor]:
        """The mixture as float64 tensors ``means`` (K, D), ``stds`` (K, D), ``weights`` (K,)."""
        return {
            "means": self.means.double(),
            "stds": self.stds.double(),
            "weights": self.log_weights.double().exp(),
        }

    def _float64_mixture(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(means, stds, log_weights)`` as float64 on ``device``."""
        return tuple(b.to(device, torch.float64) for b in (self.means, self.stds, self.log_weights))

    @staticmethod
    def _each_sigma(x: torch.Tensor, sigma, one_sigma) -> torch.Tensor:
        """``one_sigma(x, float(sigma))`` for a scalar sigma; for (B,) sigmas, once per distinct level."""
        sigma = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1)
        if sigma.numel() == 1:
            return one_sigma(x, float(sigma))
        out = torch.empty_like(x)
        for value in sigma.unique():  # per-sample noise levels: solve each level as one batch
            rows = (sigma == value).to(x.device)
            out[rows] = one_sigma(x[rows], float(value))
        return out

    @staticmethod
    def _responsibilities(
        x: torch.Tensor, centers: torch.Tensor, inv_var: torch.Tensor, log_weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Responsibilities (B, K) of the components ``N(centers, 1 / inv_var)``, and ``centers * inv_var``.

        Quadratic forms expanded into (B, D) @ (D, K) products: no (B, K, D) temporary, BLAS speed.
        """
        scaled = centers * inv_var
        quadratic = (x**2) @ inv_var.T - 2 * x @ scaled.T + (centers * scaled).sum(-1)
        log_likelihood = -0.5 * (quadratic - inv_var.log().sum(-1)) + log_weights  # (B, K)
        return torch.softmax(log_likelihood, dim=-1), scaled

    def _batch_sigma(self, timestep, batch: int) -> torch.Tensor:
        """``timestep_to_sigma(timestep)`` as a 1-D tensor of 1 or ``batch`` values (else ValueError)."""
        sigma = self.timestep_to_sigma(timestep).reshape(-1)
        if sigma.numel() not in (1, batch):
            raise ValueError(f"timestep has {sigma.numel()} values; expected 1 or the batch size {batch}")
        return sigma


class GMMDenoiser(MixtureDenoiser):
    """Exact epsilon prediction for a diagonal Gaussian mixture; a drop-in for a ``UNet2DModel``.

    The mixture lives in float64 buffers (``means``, ``stds``, ``log_weights``) so ``save_pretrained`` /
    ``from_pretrained`` round-trip it bit for bit; the constructor fills them from ``mixture_seed``. All maths
    runs in float64 and the output has the input's dtype. (Casting the module to float16 quantizes the
    buffers, i.e. changes the model; ``exact_samples`` reads the same buffers, so it stays consistent.)

    >>> den = GMMDenoiser(mixture_seed=0)
    >>> den(torch.zeros(2, 1, 8, 8), 999).sample.shape
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
        beta_start: float = 0.00085,
        beta_end: float = 0.012,
        beta_schedule: str = "scaled_linear",
    ):
        super().__init__()
        self._init_mixture(
            sample_size, in_channels, out_channels, num_components, mixture_seed, mean_scale, std_min, std_max
        )
        # Same float32 alphas_cumprod the schedulers compute, widened: sigma(t) agrees with theirs exactly.
        table = DDPMScheduler(
            num_train_timesteps=num_train_timesteps,
            beta_start=beta_start,
            beta_end=beta_end,
            beta_schedule=beta_schedule,
        ).alphas_cumprod.double()
        # A plain attribute, not a buffer: a dtype cast of the module must not round the noise schedule.
        self._log_sigma_table = (((1 - table) / table).sqrt()).log()

    @property
    def sigma_max(self) -> float:
        """Sigma at the last training timestep (t = num_train_timesteps - 1)."""
        return float(self._log_sigma_table[-1].exp())

    @property
    def sigma_min(self) -> float:
        """Sigma at t = 0, the smallest sigma of the discrete table."""
        return float(self._log_sigma_table[0].exp())

    def timestep_to_sigma(self, timestep) -> torch.Tensor:
        """Float64 sigma for real-valued timesteps (log-sigma linearly interpolated; clamped to the table).

        >>> den = GMMDenoiser()
        >>> round(float(den.timestep_to_sigma(999)), 3), round(float(den.timestep_to_sigma(0)), 4)
        (14.615, 0.0292)
        """
        t = torch.as_tensor(timestep, dtype=torch.float64).cpu()
        table = self._log_sigma_table
        t = t.clamp(0, len(table) - 1)
        low = t.floor().clamp(max=len(table) - 2).long()
        frac = t - low
        return ((1 - frac) * table[low] + frac * table[low + 1]).exp()

    def epsilon_at_sigma(self, xbar: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
        """E[eps | xbar] where xbar = x0 + sigma * eps; ``xbar`` is (B, D) float64, sigma scalar or (B,).

        Bypasses ``forward`` (and any hooks on it); the exact ODE solver calls this.
        """
        return self._each_sigma(xbar, sigma, self._epsilon_one_sigma)

    def _epsilon_one_sigma(self, xbar: torch.Tensor, sigma: float) -> torch.Tensor:
        means, stds, log_weights = self._float64_mixture(xbar.device)
        inv_var = 1 / (stds**2 + sigma**2)  # (K, D)
        responsibility, scaled_means = self._responsibilities(xbar, means, inv_var, log_weights)
        # sum_k r_k * sigma * (xbar - mu_k) / var_k
        return sigma * (xbar * (responsibility @ inv_var) - responsibility @ scaled_means)

    def forward(self, sample: torch.Tensor, timestep, return_dict: bool = True, **ignored_unet_kwargs):
        """Exact E[eps | x_t] for ``sample`` = x_t (B, C, H, W) at ``timestep`` (number, 0-d or (B,) tensor).

        Other ``UNet2DModel`` keyword arguments (``class_labels``, ...) are accepted and ignored.
        """
        batch = sample.shape[0]
        sigma = self._batch_sigma(timestep, batch).to(sample.device).expand(batch)
        xbar = sample.reshape(batch, -1).double() * (1 + sigma[:, None] ** 2).sqrt()
        eps = self.epsilon_at_sigma(xbar, sigma).reshape(sample.shape).to(sample.dtype)
        return UNet2DOutput(sample=eps) if return_dict else (eps,)


def default_scheduler() -> DDIMScheduler:
    """The scheduler saved with the pipeline: deterministic DDIM that starts at t=999 and ends at sigma=0.

    ``timestep_spacing="trailing"`` makes the first step t=999 (= sigma_max, where the exact solve starts) and
    ``set_alpha_to_one=True`` makes the last step land on sigma=0; ``clip_sample=False`` keeps samples raw.
    Schedulers made with ``X.from_config(pipe.scheduler.config)`` inherit the trailing spacing.
    """
    return DDIMScheduler(
        **SCHEDULE,
        clip_sample=False,
        set_alpha_to_one=True,
        timestep_spacing="trailing",
        steps_offset=0,
        prediction_type="epsilon",
    )


@register_pipeline(PipelineFacts("batch_size", default_batch=256))
class GMMPipeline(DiffusionPipeline):
    """Unconditional sampling of the Gaussian-mixture model with any diffusers scheduler.

    Initial noise: ``z = randn_tensor((batch_size, C, S, S), generator=generator, dtype=torch.float32)``
    (drawn on the CPU generator's device), or ``z = latents`` if given; the scheduler starts from
    ``z * scheduler.init_noise_sigma``. ``images`` are the raw final samples: numpy (N, S, S, C) for
    ``output_type="np"``, torch (N, C, S, S) for ``"pt"``.

    >>> pipe = GMMPipeline(GMMDenoiser(), default_scheduler())
    >>> pipe(batch_size=2, num_inference_steps=5, output_type="pt").images.shape
    torch.Size([2, 1, 8, 8])
    """

    model_cpu_offload_seq = "unet"

    def __init__(self, unet: GMMDenoiser, scheduler):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 50,
        generator=None,
        output_type: str = "np",
        return_dict: bool = True,
        latents: torch.Tensor | None = None,
    ):
        device, latents = self._start_latents(batch_size, generator, output_type, latents)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        latents = latents * self.scheduler.init_noise_sigma

        step_kwargs = self._step_kwargs(generator)
        for t in self.progress_bar(self.scheduler.timesteps):
            model_input = self.scheduler.scale_model_input(latents, t)
            eps = self.unet(model_input, t).sample
            latents = self.scheduler.step(eps, t, latents, **step_kwargs).prev_sample
        return self._finish(latents, output_type, return_dict)

    def _start_latents(self, batch_size, generator, output_type: str, latents) -> tuple[torch.device, torch.Tensor]:
        """Check the call's arguments; ``(device, z)``, z the float32 standard normal start or ``latents``."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r} is not supported; allowed: {', '.join(OUTPUT_TYPES)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        device = self._execution_device
        config = self.unet.config
        shape = (batch_size, config.in_channels, config.sample_size, config.sample_size)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents have shape {tuple(latents.shape)}; expected {shape}")
        return device, latents.to(device=device, dtype=torch.float32)

    def _step_kwargs(self, generator) -> dict:
        # Only stochastic schedulers (DDPM, Euler ancestral, SDE solvers, LCM) take a generator.
        return {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}

    def _finish(self, latents: torch.Tensor, output_type: str, return_dict: bool):
        self.maybe_free_model_hooks()
        images = latents.permute(0, 2, 3, 1).cpu().numpy() if output_type == "np" else latents
        return ImagePipelineOutput(images=images) if return_dict else (images,)


@register_model("gmm", sizes=("test", "bench"))
def build_gmm(out_dir: Path, size: str, seed: int) -> None:
    """Write a GMMPipeline (6 components, 1x8x8, DDIM trailing scheduler); both sizes are identical.

    >>> build_gmm(Path("/tmp/gmm-doctest"), size="test", seed=0)  # or fastdiff.zoo.build("gmm", ...)
    """
    pipe = GMMPipeline(unet=GMMDenoiser(mixture_seed=seed), scheduler=default_scheduler())
    pipe.save_pretrained(str(out_dir))


# The exact solver and the quality evaluator live next door; importing registers the evaluator.
from fastdiff.zoo.gmm_exact import exact_samples, gmm_quality, ode_error  # noqa: E402

__all__ = [
    "GMMDenoiser",
    "MixtureDenoiser",
    "GMMPipeline",
    "build_gmm",
    "default_scheduler",
    "exact_samples",
    "gmm_quality",
    "make_mixture",
    "ode_error",
]
