"""Search for the K timesteps that bring a sampler closest to the exact answer from the same noise.

The objective is the mean L2 distance (``ode_error``) between the sampler's K-step samples and a reference
from the same initial noise, over calibration seeds 1000, 1001, ... (8 by default; apart from the benchmarks' seed 0). On
the exact-score model (``GMMPipeline``) the reference is the DOP853 solve of the probability-flow ODE;
elsewhere it is DPM-Solver++(2M) with Karras sigmas at ``reference_steps`` steps (on the exact model 100
such steps are 0.018 from DOP853, the floor of any schedule that must end on t=0 and jump from there to
sigma=0; see docs/tuned-schedules.md).

The search, in the spirit of Align Your Steps and optimal-stepsize search: evaluate the standard spacings
(trailing, linspace, Karras, log-SNR, beta, the AYS lists diffusers ships, log-linearly interpolated to K
points as the AYS paper does), start from the best, run scipy's Nelder-Mead over a monotone
parameterisation (softmax of the log-sigma decrements, so every point is strictly decreasing), then polish
the integer timesteps one at a time. The best schedule evaluated is kept, so the result is never worse than
the starting spacing on the calibration seeds. Timesteps are integers (what DPM-Solver's and Euler's
``set_timesteps(timesteps=...)`` take, and what the models were trained on). The first timestep is free
(``free_start=True``, the default): starting a little below T-1 from the same noise can cost less than it
gains; ``free_start=False`` pins it at T-1 as the standard spacings are.

Flow-matching models (presets ``flow-euler``, ``flow-dpm++2m``, ``flow-unipc``): the same search over integer
timesteps t in [1, T] (sigma t / T), from the standard flow spacings, against the exact flow solve on
``gmm-flow`` and a fine UniPC run elsewhere; see ``fastdiff.schedulers.tuning_flow``.

Example::

    from fastdiff.schedulers.tuning import tune
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    pipe = GMMPipeline(GMMDenoiser(), default_scheduler())
    tuned = tune(pipe, "dpm++2m", nfe=6, seeds=2, batch=64, max_evals=200)
    tuned.save("schedule.json")  # then fp.accelerate("scheduler(name=dpm++2m);timesteps(path=schedule.json)")
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from diffusers import DPMSolverMultistepScheduler
from diffusers.schedulers import AysSchedules
from tqdm.auto import tqdm

from fastdiff.core.models import model_prediction
from fastdiff.core.registry import AcceleratorError
from fastdiff.schedulers.exact import exact_references, ode_error
from fastdiff.schedulers.presets import FLOW_PRESETS, explicit_config, make_scheduler
from fastdiff.schedulers.spacing import Spacing, strictly_decreasing
from fastdiff.schedulers.tuned import (
    ROUTES,
    TunedSchedule,
    check_sampler,
    install_timesteps,
    model_hash,
)
from fastdiff.schedulers.tuning_flow import flow_references, flow_spacing, flow_spacings

CALIBRATION_SEED = 1000
STARTS = 3  # searches from the best few standard spacings
# name -> flags of DPMSolverMultistepScheduler that produce the spacing (diffusers computes the timesteps)
SPACING_FLAGS = {
    "trailing": {"timestep_spacing": "trailing"},
    "linspace": {"timestep_spacing": "linspace"},
    "karras": {"use_karras_sigmas": True},
    "log-snr": {"use_lu_lambdas": True},
    "beta": {"use_beta_sigmas": True},
}
AYS_LISTS = {"ays-sd": "StableDiffusionTimesteps", "ays-sdxl": "StableDiffusionXLTimesteps"}


def standard_spacings(scheduler, steps: int) -> dict[str, list[int]]:
    """The standard spacings of ``steps`` integer timesteps for ``scheduler``'s noise schedule, all from T-1."""
    spacing, total = Spacing(scheduler, steps), scheduler.config.num_train_timesteps
    out = {}
    for name, flags in SPACING_FLAGS.items():
        reference = DPMSolverMultistepScheduler.from_config(
            explicit_config(scheduler.config, "DPMSolverMultistepScheduler"), **flags
        )
        reference.set_timesteps(steps)
        out[name] = strictly_decreasing(reference.timesteps.tolist(), total)
    for name, key in AYS_LISTS.items():
        log_sigma = spacing.log_sigma[AysSchedules[key]]
        points = np.interp(np.linspace(0, 1, steps), np.linspace(0, 1, len(log_sigma)), log_sigma)
        out[name] = strictly_decreasing(spacing.to_t(points), total)
    return out


class Exhausted(Exception):
    """The evaluation budget is spent."""


class Objective:
    """Mean distance to the reference over calibration seeds, cached per timestep list, with a search log.

    ``offset`` is added to the points searched to get timesteps (flow schedules search indices t - 1)."""

    def __init__(
        self,
        pipe,
        route: str,
        inputs: dict,
        references: dict,
        max_evals: int,
        progress: bool,
        offset: int = 0,
    ):
        self.pipe, self.route, self.inputs, self.references = pipe, route, inputs, references
        self.offset = offset
        self.cache: dict[tuple, float] = {}
        self.best, self.best_value, self.log = None, float("inf"), []
        self.max_evals = self.limit = max_evals
        self.bar = tqdm(total=max_evals, desc="tune-schedule", unit="eval", disable=not progress)

    @property
    def exhausted(self) -> bool:
        return len(self.cache) >= min(self.limit, self.max_evals)

    def __call__(self, timesteps: list[int]) -> float:
        key = tuple(timesteps)
        if key not in self.cache and self.exhausted:
            raise Exhausted
        if key not in self.cache:
            shifted = [t + self.offset for t in timesteps]
            errors = [
                ode_error(sample(self.pipe, self.inputs, seed, len(shifted), shifted, self.route), reference)
                for seed, reference in self.references.items()
            ]
            value = self.cache[key] = float(np.mean(errors))
            if value < self.best_value:
                self.best, self.best_value = list(timesteps), value
                self.log.append([len(self.cache), value])
            self.bar.update()
            self.bar.set_postfix(best=f"{self.best_value:.4f}")
        return self.cache[key]


def sample(pipe, inputs: dict, seed: int, steps: int, timesteps=None, route=None) -> torch.Tensor:
    """The pipeline's ``output_type="pt"`` samples; on ``timesteps`` if given, else the scheduler's spacing."""
    handle = install_timesteps(pipe.scheduler, timesteps, route) if timesteps is not None else None
    try:
        generator = torch.Generator().manual_seed(seed)
        out = pipe(**inputs, num_inference_steps=steps, generator=generator, output_type="pt")
    finally:
        if handle is not None:
            handle.remove()
    return out.images.detach().double().cpu()


def references(pipe, inputs: dict, seeds: list[int], reference_steps: int) -> tuple[dict, str]:
    """{seed: reference samples} and a description: the exact solve on the GMMs, else a high-NFE run."""
    if model_prediction(pipe.scheduler) == "flow":
        return flow_references(pipe, inputs, seeds, reference_steps, sample)
    exact = exact_references(pipe, inputs.get("batch_size", 1), seeds, "noise")
    if exact is not None:
        return exact
    original = pipe.scheduler
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(
        explicit_config(original.config, "DPMSolverMultistepScheduler"),
        algorithm_type="dpmsolver++",
        solver_order=2,
        use_karras_sigmas=True,
    )
    try:
        out = {s: sample(pipe, inputs, s, reference_steps) for s in seeds}
    finally:
        pipe.scheduler = original
    return out, f"DPM-Solver++(2M) Karras, {reference_steps} steps"


def search(objective: Objective, spacing: Spacing, start: list[int], limit: int) -> None:
    """Nelder-Mead on theta from ``start``, then integer polish, repeated while it gains (up to ``limit`` evals)."""
    from scipy.optimize import minimize

    point, value = start, objective(start)
    objective.limit = min(limit, objective.max_evals)
    while not objective.exhausted:
        theta = spacing.theta(point)
        simplex = theta + np.vstack([np.zeros(len(theta)), 0.7 * np.eye(len(theta))])
        try:
            result = minimize(
                lambda th: objective(spacing.timesteps(th)),
                theta,
                method="Nelder-Mead",
                options={"maxfev": 4 * objective.max_evals, "initial_simplex": simplex, "xatol": 1e-3},
            )
            found = spacing.timesteps(result.x)
            top = len(spacing.log_sigma) - 1 if spacing.free_start else None
            found, found_value = polish(objective, found, objective(found), top)
        except Exhausted:
            return  # the objective keeps the best schedule evaluated
        if found_value >= value * (1 - 1e-4):
            return
        point, value = found, found_value


def polish(objective: Objective, point: list[int], value: float, top: int | None = None) -> tuple[list[int], float]:
    """Move single timesteps by 64, 16, 4, 1 while that lowers the objective (scipy has no integer search).

    ``top``: the first timestep may move too, up to ``top`` (None: it stays where it is)."""
    improved = True
    while improved and not objective.exhausted:
        improved = False
        for i in range(0 if top is not None else 1, len(point)):
            for delta in (64, -64, 16, -16, 4, -4, 1, -1):
                trial = list(point)
                trial[i] += delta
                lower = trial[i + 1] if i + 1 < len(trial) else -1
                if lower < trial[i] < (trial[i - 1] if i else top + 1):
                    trial_value = objective(trial)
                    if trial_value < value:
                        point, value, improved = trial, trial_value, True
    return point, value


def tune(
    pipe,
    sampler: str,
    nfe: int,
    seeds: int = 8,
    batch: int | None = None,
    reference_steps: int = 100,
    max_evals: int = 1500,
    progress: bool = True,
    scheduler=None,
    starts: int = STARTS,
    free_start: bool = True,
) -> TunedSchedule:
    """Tune ``nfe`` timesteps of preset ``sampler`` on a diffusers ``pipe`` (its scheduler is restored).

    ``scheduler``: tune this scheduler object instead of the preset (``sampler`` is then only a label; the
    benchmarks tune DDIM as first-order DPM-Solver++, the same update, since DDIMScheduler takes no timesteps).
    ``free_start=False`` keeps the first timestep at T-1.
    """
    from fastdiff.core.inputs import make_inputs

    if nfe < 2 or seeds < 1 or max_evals < 1:
        raise ValueError(f"need nfe >= 2, seeds >= 1, max_evals >= 1; got {nfe}, {seeds}, {max_evals}")
    flow = model_prediction(pipe.scheduler) == "flow"
    if scheduler is None and flow != (sampler in FLOW_PRESETS):
        kind = "flow-matching" if flow else "noise-predicting"
        able = [s for s in ("flow-euler", "flow-dpm++2m", "flow-unipc") if flow] or [
            "dpm++2m",
            "unipc",
            "deis",
            "euler",
        ]
        raise AcceleratorError(
            f"sampler {sampler!r} does not fit {type(pipe).__name__}'s {kind} model; tune one of {', '.join(able)}"
        )
    original, bar_config = pipe.scheduler, dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    inputs = make_inputs(pipe, batch)
    calibration = [CALIBRATION_SEED + i for i in range(seeds)]
    refs, described = references(pipe, inputs, calibration, reference_steps)
    pipe.scheduler = scheduler or make_scheduler(sampler, original.config)
    try:
        if scheduler:
            route = "flow" if flow else ROUTES[type(scheduler).__name__]
        else:
            route = check_sampler(pipe.scheduler, sampler)
        objective = Objective(pipe, route, inputs, refs, max_evals, progress, offset=int(flow))
        spacings = (flow_spacings if flow else standard_spacings)(pipe.scheduler, nfe)
        candidates = {name: objective(ts) for name, ts in spacings.items()}
        ranked = sorted(candidates, key=candidates.get)
        spacing = (flow_spacing if flow else Spacing)(pipe.scheduler, nfe, free_start)
        points = [spacings[name] for name in ranked[:starts]]
        for i, point in enumerate(points):  # several starts: the objective has more than one basin
            share = (objective.max_evals - len(objective.cache)) // (len(points) - i)
            search(objective, spacing, point, len(objective.cache) + share)
        objective.bar.close()
        best = [t + objective.offset for t in objective.best]
        probe = copy.deepcopy(pipe.scheduler)
        install_timesteps(probe, best, route)
        probe.set_timesteps(nfe, **({"mu": 0.0} if probe.config.get("use_dynamic_shifting") else {}))
        sigmas = [round(float(s), 6) for s in probe.sigmas]
    finally:
        pipe.scheduler = original
        pipe.set_progress_bar_config(**bar_config)
    return TunedSchedule(
        model_hash=model_hash(pipe),
        model=str(getattr(pipe, "name_or_path", "") or type(pipe).__name__),
        sampler=sampler,
        nfe=nfe,
        timesteps=best,
        sigmas=sigmas,
        objective={
            "distance": "mean L2 distance to the reference from the same noise (ode_error)",
            "reference": described,
            "seeds": calibration,
            "batch": next(len(v) for v in refs.values()),
            "start": {"spacing": ranked[0], "value": candidates[ranked[0]]},
            **({"sigmas": "t / num_train_timesteps, installed as they are (no shift)"} if flow else {}),
            "tuned": objective.best_value,
            "evaluations": len(objective.cache),
            "candidates": candidates,
        },
        log=objective.log,
    )
