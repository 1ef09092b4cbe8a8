"""Progressive distillation of a flow-matching model (rectified flow; SD3, Flux-shaped transformers).

The same halving as ``progressive`` for epsilon/v models, in the flow model's own terms: on the sigma grid
the model's flow Euler sampler uses for N steps (``scheduler.set_timesteps(N)``, its shift included), a
student step ``sigma_j -> sigma_j+1`` is trained to land where two teacher Euler steps land (through the
midpoint sigma), so its target velocity is the mean of the teacher's two: ``(v(z, s_j) + v(z_m, s_m)) / 2``.
The loss is the MSE of the velocity (the student predicts velocity, like its teacher; no change of
parameterisation). With guidance > 1 the first teacher is guided and the students bake it in.

Training samples are the teacher's own: ``pool`` images generated once at ``2 * start`` steps from the bench
prompts (``make_inputs``), each kept with its prompt's conditioning, so every noised sample ``(1 - s) x0 + s
noise`` is paired with the prompt that made it; no training data is needed.

Example::

    from fastdiff.distill.progressive import progressive
    from fastdiff.zoo import build

    teacher = build("digits-flow", "/tmp/digits-flow", size="test")
    progressive(teacher, "/tmp/flow-prog", start=8, end=4, steps_per_round=5, batch=4, pool=8)
    # fastdiff.distill.common.load_student("/tmp/flow-prog/steps-4")(prompt="a seven", output_type="np")
"""

from __future__ import annotations

import copy

import torch

from fastdiff.distill.common import DistillError
from fastdiff.train.data import FlowBatches
from fastdiff.train.inputs import denoiser_output, to_device


def check_flow_teacher(fp) -> None:
    """DistillError for a flow model whose sigmas this distillation cannot reproduce (dynamic shifting)."""
    config = fp.pipe.scheduler.config
    if config.get("use_dynamic_shifting"):
        raise DistillError(
            f"the teacher's {type(fp.pipe.scheduler).__name__} shifts its sigmas by image size "
            "(use_dynamic_shifting=True: Flux, Qwen-Image); progressive distillation needs a fixed grid"
        )


def flow_grid(scheduler, steps: int) -> torch.Tensor:
    """The sigmas (``steps + 1``, ending at 0) the scheduler's own ``set_timesteps(steps)`` samples on."""
    trial = copy.deepcopy(scheduler)
    trial.set_timesteps(steps)
    return torch.as_tensor(trial.sigmas, dtype=torch.float32).flatten()


def guided_velocity(model, key: str, z, t, cond, uncond, scale: float):
    """The (classifier-free guided, ``scale`` > 1) velocity of ``model`` at noisy ``z`` and timestep ``t``."""
    v = denoiser_output(model, {key: z, "timestep": t, **cond})
    if uncond is None or scale == 1:
        return v
    v_uncond = denoiser_output(model, {key: z, "timestep": t, **uncond})
    return v_uncond + scale * (v - v_uncond)


def flow_round_loss(batches: FlowBatches, teacher, scale: float, grid: torch.Tensor, train_steps: int):
    """Loss of one round: a student step on ``grid`` against two teacher Euler steps through the midpoint."""
    n = grid.numel() - 1

    def loss_fn(student, g, device):
        x0, cond, uncond = batches.batch(g)
        j = torch.randint(0, n, (x0.shape[0],), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        shape = (-1,) + (1,) * (x0.dim() - 1)
        s, e = grid[j].to(device), grid[j + 1].to(device)
        m = (s + e) / 2
        x0, noise = x0.to(device), noise.to(device)
        cond, uncond = to_device(cond, device), to_device(uncond, device) if uncond is not None else None
        z = (1 - s.view(shape)) * x0 + s.view(shape) * noise
        with torch.no_grad():
            v1 = guided_velocity(teacher, batches.key, z, s * train_steps, cond, uncond, scale)
            z_mid = z + (m - s).view(shape) * v1
            v2 = guided_velocity(teacher, batches.key, z_mid, m * train_steps, cond, uncond, scale)
            target = (v1 + v2) / 2  # (z_end - z) / (e - s) with z_end = z_mid + (e - m) v2
        v = denoiser_output(student, {batches.key: z, "timestep": s * train_steps, **cond})
        return ((v - target) ** 2).mean()

    return loss_fn
