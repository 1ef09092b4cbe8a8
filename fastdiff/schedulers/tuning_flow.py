"""The flow-matching half of ``fastdiff.schedulers.tuning``: search space, standard spacings and references.

A flow schedule is K integer timesteps t in [1, top] with sigma s = t / T (T = num_train_timesteps); ``top``
is T for FlowMatchEuler (it starts at s = 1) and T - 1 for DPM-Solver and UniPC, whose log-SNR is infinite at
s = 1 (they start at 0.999 themselves). The search runs on indices i = t - 1 into the table of log-sigmas
log((i + 1) / T), with the same softmax-of-decrements parameterisation, Nelder-Mead and integer polish as the
noise-schedule search (``spacing.Spacing``, ``tuning.search``).

Standard spacings (the starting points, each from s = top / T): ``uniform`` (FlowMatchEuler's linspace from
1 to 1/T), ``trailing`` (DPM-Solver's and UniPC's ``1 - linspace``), each with shift 1 and 3 (and the model's
own shift), ``karras`` (rho 7 between the VP sigmas 0.029 and 14.6 of SD, mapped to the flow path by
s = sigma / (1 + sigma)) and the SD / SDXL Align-Your-Steps lists mapped the same way, log-linearly
interpolated to K points.

References: on ``gmm-flow`` the exact DOP853 solve of the flow ODE (``fastdiff.zoo.gmm_flow.exact_samples``);
elsewhere UniPC on flow sigmas at ``reference_steps`` steps with the model's shift (on ``gmm-flow`` 100 such
steps are 0.007 from the exact solve, DPM-Solver++ 2M's 0.013, FlowMatchEuler's 0.046).
"""

from __future__ import annotations

import numpy as np
from diffusers import DDPMScheduler
from diffusers.schedulers import AysSchedules

from fastdiff.schedulers.exact import exact_references
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.schedulers.spacing import Spacing, strictly_decreasing

SHIFTS = (1.0, 3.0)
KARRAS_SIGMAS = (0.0292, 14.6146)  # SD's VP sigma range (t = 0 and t = 999 of its scaled-linear table)
AYS_LISTS = {"ays-sd": "StableDiffusionTimesteps", "ays-sdxl": "StableDiffusionXLTimesteps"}


def flow_top(scheduler) -> int:
    """The largest timestep a flow schedule may start from: T for FlowMatch classes, else T - 1."""
    total = scheduler.config.num_train_timesteps
    return total if type(scheduler).__name__.startswith("FlowMatch") else total - 1


def model_shift(scheduler) -> float:
    config = scheduler.config
    return float(config["shift"] if "shift" in config else config.get("flow_shift", 1.0))


def shifted(sigmas: np.ndarray, shift: float) -> np.ndarray:
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def to_indices(sigmas, total: int, top: int) -> list[int]:
    """Indices t - 1 of sigmas, rounded, starting at ``top`` and strictly decreasing (>= 0).

    >>> to_indices([1.0, 0.5, 0.0004], 1000, 999)
    [998, 499, 0]
    """
    return strictly_decreasing(np.asarray(sigmas, dtype=np.float64) * total - 1, top)


def vp_to_flow(vp_sigma) -> np.ndarray:
    """Flow sigma of a VP sigma: x_s / (1 - s) = x0 + s / (1 - s) eps, so s = sigma / (1 + sigma)."""
    vp_sigma = np.asarray(vp_sigma, dtype=np.float64)
    return vp_sigma / (1 + vp_sigma)


def flow_spacings(scheduler, steps: int) -> dict[str, list[int]]:
    """The standard flow spacings of ``steps`` indices (t - 1) for ``scheduler``, all from ``flow_top``."""
    total, top = scheduler.config.num_train_timesteps, flow_top(scheduler)
    out = {}
    for shift in sorted({*SHIFTS, model_shift(scheduler)}):
        uniform = np.linspace(1.0, 1 / total, steps)
        trailing = (1 - np.linspace(1, 1 / total, steps + 1))[::-1][:-1]
        out[f"uniform-shift{shift:g}"] = to_indices(shifted(uniform, shift), total, top)
        out[f"trailing-shift{shift:g}"] = to_indices(shifted(trailing, shift), total, top)
    low, high = KARRAS_SIGMAS
    ramp = np.linspace(0, 1, steps)
    karras = (high ** (1 / 7) + ramp * (low ** (1 / 7) - high ** (1 / 7))) ** 7
    out["karras"] = to_indices(vp_to_flow(karras), total, top)
    sd = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    log_vp = (((1 - sd.alphas_cumprod) / sd.alphas_cumprod) ** 0.5).double().log().numpy()
    for name, key in AYS_LISTS.items():
        points = log_vp[AysSchedules[key]]
        log_sigma = np.interp(np.linspace(0, 1, steps), np.linspace(0, 1, len(points)), points)
        out[name] = to_indices(vp_to_flow(np.exp(log_sigma)), total, top)
    return out


def flow_spacing(scheduler, steps: int, free_start: bool):
    """A ``spacing.Spacing`` over indices t - 1 of the flow log-sigma table log(t / T), t = 1 .. top."""
    spacing = Spacing.__new__(Spacing)
    spacing.steps, spacing.free_start = steps, free_start
    total = scheduler.config.num_train_timesteps
    spacing.log_sigma = np.log(np.arange(1, flow_top(scheduler) + 1, dtype=np.float64) / total)
    spacing.top, spacing.bottom = spacing.log_sigma[-1], spacing.log_sigma[0]
    return spacing


def flow_references(pipe, inputs: dict, seeds: list[int], reference_steps: int, sample) -> tuple[dict, str]:
    """{seed: reference samples} for a flow model: the exact solve on gmm-flow, else a fine UniPC run."""
    exact = exact_references(pipe, inputs.get("batch_size", 1), seeds, "flow")
    if exact is not None:
        return exact
    original = pipe.scheduler
    pipe.scheduler = make_scheduler("flow-unipc", original.config)
    try:
        out = {s: sample(pipe, inputs, s, reference_steps) for s in seeds}
    finally:
        pipe.scheduler = original
    return out, f"UniPC on flow sigmas (shift {model_shift(original):g}), {reference_steps} steps"
