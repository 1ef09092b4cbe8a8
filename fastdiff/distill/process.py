"""The noise process a teacher was trained on, in the terms one-step distillation needs: noising a sample at a
level, reading x0 from a denoiser's output, the denoiser's training target, and the generator's readout.

A level is an index ``i`` in ``[0, total)``. ``Diffusion`` is DDPM's alpha-bar schedule with an epsilon, v or
sample prediction (timestep ``i``); ``Flow`` is rectified flow (``x_t = (1 - s) x0 + s noise`` with
``s = (i + 1) / total``, timestep ``s * total``, velocity ``noise - x0``). The generator reads pure noise at the
last level: a v readout for diffusion (an epsilon one would divide by sqrt(alpha-bar) there), the velocity for
flow (``x0 = z - v``).

Example::

    process = process_for(fp.pipe.scheduler)
    x_t, timestep = process.noise(x0, noise, levels)
    x0_hat = process.x0(denoiser_output, x_t, levels)
"""

from __future__ import annotations

import torch

from fastdiff.core.models import model_prediction
from fastdiff.distill.common import alphas, to_eps_x0, trailing_grid


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.view((-1,) + (1,) * (like.dim() - 1)).to(like.device, like.dtype)


class Diffusion:
    """DDPM (alpha-bar) teachers predicting epsilon, v or the sample; the generator predicts v."""

    generator_kind = "v_prediction"

    def __init__(self, scheduler):
        self.kind = model_prediction(scheduler)
        self.total = scheduler.config.num_train_timesteps
        self.a = alphas(scheduler.config)

    def timestep(self, levels: torch.Tensor) -> torch.Tensor:
        return levels

    def noise(self, x0, noise, levels):
        a = _per_sample(self.a[levels.cpu()], x0)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, self.timestep(levels)

    def x0(self, out, x_t, levels, kind=None):
        return to_eps_x0(out, x_t, _per_sample(self.a[levels.cpu()], x_t), kind or self.kind)[1]

    def target(self, x0, noise, levels):
        a = _per_sample(self.a[levels.cpu()], x0)
        if self.kind == "epsilon":
            return noise
        if self.kind == "sample":
            return x0
        return a.sqrt() * noise - (1 - a).sqrt() * x0  # v_prediction

    def noise_from(self, x_t, x0, levels):
        a = _per_sample(self.a[levels.cpu()], x_t)
        return (x_t - a.sqrt() * x0) / (1 - a).sqrt()

    def ode_levels(self, steps: int) -> list[int]:
        return [int(t) for t in trailing_grid(steps, self.total)]

    def generator_timestep(self, n: int) -> torch.Tensor:
        return torch.full((n,), self.total - 1)

    def generator_x0(self, out, z):
        last = torch.full((z.shape[0],), self.total - 1)
        return self.x0(out, z, last, self.generator_kind)


class Flow:
    """Rectified-flow teachers predicting velocity (``noise - x0``); the generator predicts it too."""

    generator_kind = "flow"

    def __init__(self, scheduler):
        self.kind = "flow"
        self.total = scheduler.config.num_train_timesteps

    def sigma(self, levels, like):
        return _per_sample((levels.float() + 1) / self.total, like)

    def timestep(self, levels: torch.Tensor) -> torch.Tensor:
        return levels.float() + 1  # sigma * total

    def noise(self, x0, noise, levels):
        s = self.sigma(levels, x0)
        return (1 - s) * x0 + s * noise, self.timestep(levels).to(x0.device)

    def x0(self, out, x_t, levels, kind=None):
        return x_t - self.sigma(levels, x_t) * out

    def target(self, x0, noise, levels):
        return noise - x0

    def noise_from(self, x_t, x0, levels):
        s = self.sigma(levels, x_t)
        return (x_t - (1 - s) * x0) / s

    def ode_levels(self, steps: int) -> list[int]:
        return [int(round(v)) for v in torch.linspace(self.total - 1, 0, steps).tolist()]

    def generator_timestep(self, n: int) -> torch.Tensor:
        return torch.full((n,), float(self.total))

    def generator_x0(self, out, z):
        return z - out


def process_for(scheduler):
    """``Flow`` for flow-matching schedulers, else ``Diffusion`` (which refuses an unknown prediction type)."""
    kind = model_prediction(scheduler)
    if kind == "flow":
        return Flow(scheduler)
    if kind not in ("epsilon", "v_prediction", "sample"):
        from fastdiff.distill.common import DistillError

        raise DistillError(
            f"the teacher's scheduler predicts {kind!r}; one-step distillation knows epsilon, "
            "v_prediction, sample and flow"
        )
    return Diffusion(scheduler)
