"""Tuned timestep schedules: ``timesteps(path=schedule.json)`` runs a sampler on timesteps tuned for the model.

``fastdiff tune-schedule MODEL --sampler dpm++2m --nfe 6 --out schedule.json`` (``fastdiff.schedulers.tuning``)
writes the JSON; this module reads it and applies it. The file records the model it was tuned for (a hash of
the denoiser's class and config and of the noise schedule), the sampler preset and the step count; applying it
to another model, another sampler or another step count is refused with an error naming the mismatch.

The schedule does not swap the scheduler: it needs the pipeline's scheduler to be the recorded preset already
(the model's own, or ``scheduler(name=...)`` listed *before* it in the spec, as kinds run in order and
``schedule`` is of the same kind), and makes that scheduler's ``set_timesteps`` use the tuned timesteps inside
the FastPipeline's calls (direct calls of the diffusers pipeline are untouched). It defaults the step count
unless ``scheduler(steps=N)`` already does, and refuses a call with another step count. A call that never
used the tuned timesteps (the scheduler was swapped after ``schedule`` was applied) is refused, not run wrong.

How each scheduler takes a custom schedule (diffusers 0.42), see ``ROUTES``: DPM-Solver and Euler through
their public ``set_timesteps(timesteps=...)``; UniPC (custom sigmas only with flow sigmas) and DEIS (none) by
setting their ``timesteps``/``sigmas`` arrays after ``set_timesteps(K)``, which is all their ``set_timesteps``
computes for the solver (a test checks their own arrays give bit-identical samples). DDIM steps by a fixed
stride and takes no custom timesteps: it is refused.

Flow-matching models (``flow-euler``, ``flow-dpm++2m``, ``flow-unipc``; route ``"flow"``): the schedule is K
integer timesteps t in [1, T] (T = num_train_timesteps), i.e. the sigmas s = t / T in (0, 1], installed as they
are whatever the model's shift or dynamic ``mu``. None of the public routes does that: FlowMatchEuler's
``set_timesteps(sigmas=...)`` and UniPC's apply the shift (or ``mu``) on top of the sigmas given,
DPM-Solver's ``set_timesteps(timesteps=...)`` fails with ``use_flow_sigmas`` (its flow branch builds linspace
sigmas from ``num_inference_steps``, which must then be None), and DPM-Solver/UniPC truncate ``s * T`` to int64 for the model. So the flow route, too, sets the
arrays after the scheduler's own ``set_timesteps(K, mu=...)``: ``sigmas`` = float32(t / T) and the final sigma
the scheduler computed, ``timesteps`` = ``sigmas * T`` in float32 for FlowMatchEuler (as its own
``set_timesteps`` derives them) and the integers t for DPM-Solver and UniPC, so the model is told exactly the
sigma the solver steps from. (With shift 1, FlowMatchEuler's ``set_timesteps(sigmas=t / T)`` gives the same
arrays bit for bit; a test checks it, and that with shift 3 it would not.)

Example::

    from fastdiff import FastPipeline
    from fastdiff.schedulers.tuning import tune
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    fp = FastPipeline(GMMPipeline(GMMDenoiser(), default_scheduler()))
    tune(fp.pipe, "dpm++2m", nfe=6, seeds=2, max_evals=100).save("/tmp/schedule.json")
    handle = fp.accelerate("scheduler(name=dpm++2m);timesteps(path=/tmp/schedule.json)")
    fp(batch_size=4)  # 6 DPM++2M steps on the tuned timesteps
    handle.remove()  # back to the model's own scheduler and spacing
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, HandleGroup, install_hook
from fastdiff.core.models import PIPELINES, family_name, find_denoiser, model_prediction
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.schedulers.catalog import FLOW_PRESETS, PRESETS, TUNABLE

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

FORMAT = "fastdiff-schedule/1"
# scheduler class -> how it takes custom timesteps ("timesteps": set_timesteps(timesteps=...); "arrays": see above)
ROUTES = {
    "DPMSolverMultistepScheduler": "timesteps",
    "EulerDiscreteScheduler": "timesteps",
    "UniPCMultistepScheduler": "arrays",
    "DEISMultistepScheduler": "arrays",
}
# why the other presets are refused (``untunable_reason``)
NOT_TUNABLE = {
    "ddim": "DDIMScheduler steps from each timestep by a fixed stride of num_train_timesteps // K and takes no "
    "custom timesteps; its update is first-order DPM-Solver++, so tune dpm++2m instead",
    "dpm++2m-karras": "its sigmas are fixed to the Karras spacing; tune dpm++2m, whose search starts from Karras",
    "heun": "two denoiser calls per step",
    "dpm++sde": "stochastic, and two denoiser calls per step",
    "ddpm": "stochastic: no deterministic K-step answer to fit",
    "euler-a": "stochastic: no deterministic K-step answer to fit",
    "dpm++2m-sde": "stochastic: no deterministic K-step answer to fit",
    "pndm": "PNDMScheduler derives its timesteps from its own warm-up and takes no custom timesteps",
    "lcm": "only for LCM-distilled models, which fix their own timesteps",
    "flow-heun": "two denoiser calls per step",
}
# flags of the flow classes that change what a step does; a tuned schedule needs their defaults
FLOW_STEP_FLAGS = ("stochastic_sampling", "invert_sigmas")


def untunable_reason(sampler: str) -> str | None:
    """None if ``sampler`` can be tuned, else the refusal (naming why, and the tunable presets)."""
    if sampler in TUNABLE:
        return None
    why = NOT_TUNABLE.get(sampler, "not a sampler preset")
    return f"sampler {sampler!r} cannot be tuned: {why}. Tunable: {', '.join(TUNABLE)}"


def model_hash(pipe) -> str:
    """16 hex digits of sha256 over the denoiser's class and config and the noise schedule it was trained on.

    The noise schedule is the scheduler's float32 ``alphas_cumprod`` (identical for every preset made from the
    model's config) and its prediction type; for a flow-matching model (no ``alphas_cumprod``) it is the sigma
    convention, ``flow_convention``, the same for every flow preset made from the model's config. Weights are
    not hashed: a retrained model with the same config matches.

    >>> from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler
    >>> len(model_hash(GMMPipeline(GMMDenoiser(), default_scheduler())))
    16
    """
    _, denoiser = find_denoiser(pipe)
    config = {k: v for k, v in dict(denoiser.config).items() if not k.startswith("_")}
    scheduler = pipe.scheduler
    if model_prediction(scheduler) == "flow":
        noise, prediction = flow_convention(scheduler), "flow"
    else:
        noise = hashlib.sha256(scheduler.alphas_cumprod.float().cpu().numpy().tobytes()).hexdigest()
        prediction = scheduler.config.get("prediction_type", "epsilon")
    blob = json.dumps([type(denoiser).__name__, config, noise, prediction], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flow_convention(scheduler) -> dict:
    """How a flow scheduler's config places sigmas: T, the shift (``shift`` in FlowMatch classes, ``flow_shift``
    in DPM-Solver/UniPC) or the dynamic-shifting settings, and the terminal stretch.

    >>> from diffusers import FlowMatchEulerDiscreteScheduler
    >>> flow_convention(FlowMatchEulerDiscreteScheduler(shift=3.0))["shift"]
    3.0
    """
    config = scheduler.config
    out = {
        "num_train_timesteps": int(config["num_train_timesteps"]),
        "use_dynamic_shifting": bool(config.get("use_dynamic_shifting")),
        "shift_terminal": config.get("shift_terminal") or None,
    }
    if out["use_dynamic_shifting"]:  # the shift is exp(mu) per call (DPM-Solver even writes it to its config)
        keys = ("base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type")
        out.update({key: config.get(key) for key in keys})
    else:
        out["shift"] = float(config["shift"] if "shift" in config else config.get("flow_shift", 1.0))
    return out


def sigma_table(scheduler) -> torch.Tensor:
    """float32 sigma of every training timestep, computed as diffusers' set_timesteps computes it."""
    alphas_cumprod = scheduler.alphas_cumprod
    return ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5


def flow_sigmas(scheduler, timesteps) -> torch.Tensor:
    """float32 sigmas t / T of flow timesteps, rounded from float64 as FlowMatchEuler's set_timesteps does."""
    total = scheduler.config.num_train_timesteps
    return torch.from_numpy((np.asarray(timesteps, dtype=np.float64) / total).astype(np.float32))


def check_sampler(scheduler, sampler: str) -> str:
    """Refuse unless ``scheduler`` is preset ``sampler`` (class and the flags presets set); return its route."""
    if reason := untunable_reason(sampler):
        raise AcceleratorError(reason)
    cls_name, flags, _ = PRESETS[sampler]
    have = type(scheduler).__name__
    if have != cls_name:
        raise AcceleratorError(
            f"the schedule was tuned for sampler {sampler} ({cls_name}) but the pipeline's scheduler is {have}; "
            f"apply scheduler(name={sampler}) before it"
        )
    defaults = type(scheduler)().config
    keys = set().union(*(f for c, f, _ in PRESETS.values() if c == cls_name)) - {"timestep_spacing"}
    keys |= {"use_flow_sigmas"} & set(defaults)
    for key in sorted(keys):
        want, got = flags.get(key, defaults[key]), scheduler.config.get(key)
        if got != want:
            raise AcceleratorError(
                f"the schedule was tuned for sampler {sampler} ({key}={want!r}) but the pipeline's "
                f"{have} has {key}={got!r}; apply scheduler(name={sampler}) before it"
            )
    if getattr(scheduler, "solver_p", None) is not None:
        raise AcceleratorError(f"{have} with a solver_p cannot take a tuned schedule")
    if sampler in FLOW_PRESETS:
        for key in FLOW_STEP_FLAGS:
            if key in defaults and scheduler.config.get(key) != defaults[key]:
                raise AcceleratorError(f"{have} with {key}={scheduler.config.get(key)!r} cannot take a tuned schedule")
        return "flow"
    return ROUTES[cls_name]


def install_timesteps(scheduler, timesteps: list[int], route: str, gate=None, on_use=None) -> Handle:
    """Make ``scheduler.set_timesteps(len(timesteps))`` set ``timesteps`` (only while ``gate()`` if given).

    A call with another step count raises; explicit ``timesteps=``/``sigmas=`` from the caller pass through.
    ``on_use()`` runs each time the tuned timesteps are set. The Handle removes the instance attribute.
    """
    if "set_timesteps" in scheduler.__dict__:
        raise AcceleratorError(f"{type(scheduler).__name__}.set_timesteps is already replaced (another schedule?)")
    original, steps = scheduler.set_timesteps, len(timesteps)

    @functools.wraps(original)  # keeps the signature pipelines inspect (retrieve_timesteps)
    def set_timesteps(num_inference_steps=None, device=None, **kwargs):
        custom = kwargs.get("timesteps") is not None or kwargs.get("sigmas") is not None
        if custom or (gate is not None and not gate()):
            return original(num_inference_steps, device=device, **kwargs)
        if num_inference_steps != steps:
            raise AcceleratorError(
                f"the schedule was tuned for {steps} steps (NFE {steps}); this call asks for {num_inference_steps}"
            )
        if route == "timesteps":
            original(device=device, timesteps=list(timesteps), **kwargs)
        elif route == "flow":  # see the module docstring; mu (dynamic shifting) is the pipeline's, unused
            original(steps, device=device, **kwargs)
            final = scheduler.sigmas[-1:]
            sigmas = flow_sigmas(scheduler, timesteps).to(final.device)
            if type(scheduler).__name__.startswith("FlowMatch"):
                scheduler.timesteps = (sigmas * scheduler.config.num_train_timesteps).to(device)
            else:
                scheduler.timesteps = torch.tensor(timesteps, dtype=torch.int64, device=device)
            scheduler.sigmas = torch.cat([sigmas, final])
        else:
            original(steps, device=device, **kwargs)
            final = scheduler.sigmas[-1:]
            scheduler.timesteps = torch.tensor(timesteps, dtype=torch.int64, device=device)
            scheduler.sigmas = torch.cat([sigma_table(scheduler)[list(timesteps)], final]).to(final.dtype)
        if on_use is not None:
            on_use()

    scheduler.set_timesteps = set_timesteps
    return Handle(lambda: scheduler.__dict__.pop("set_timesteps", None))


@dataclass
class TunedSchedule:
    """The JSON file: what it was tuned for, the timesteps, and how the search went."""

    model_hash: str
    sampler: str
    nfe: int
    timesteps: list[int]  # flow samplers: t in [1, T], sigma = t / T
    sigmas: list[float]  # noise level of each timestep, then the sampler's final one
    model: str = ""
    objective: dict = field(default_factory=dict)  # reference, seeds, start and tuned values, candidates
    log: list = field(default_factory=list)  # [evaluations, best objective] at each improvement
    format: str = FORMAT

    def __post_init__(self):
        ts = [int(t) for t in self.timesteps]
        low = 1 if self.sampler in FLOW_PRESETS else 0  # a flow sigma of 0 is the end, not a step
        if len(ts) != self.nfe or any(a <= b for a, b in zip(ts, ts[1:])) or ts[-1] < low:
            raise AcceleratorError(f"timesteps {ts} are not {self.nfe} strictly decreasing values >= {low}")
        self.timesteps = ts

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TunedSchedule:
        path = Path(path)
        if not path.is_file():
            raise AcceleratorError(f"schedule file {str(path)!r} does not exist")
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise AcceleratorError(f"{path} is not a {FORMAT} file (format={data.get('format')!r})")
        try:
            return cls(**data)
        except TypeError as exc:  # missing or unknown fields
            raise AcceleratorError(f"{path}: {exc}") from exc

    def check(self, pipe) -> str:
        """Refuse another kind of model, model or sampler (naming the mismatch); return the scheduler's route."""
        predicts = model_prediction(pipe.scheduler)
        if (self.sampler in FLOW_PRESETS) != (predicts == "flow"):
            tuned_for = "a flow-matching model" if self.sampler in FLOW_PRESETS else "a noise-predicting model"
            raise AcceleratorError(
                f"the schedule was tuned for {tuned_for} (sampler {self.sampler}) but the {family_name(pipe)} "
                f"model predicts {predicts} (its scheduler: {type(pipe.scheduler).__name__})"
            )
        have = model_hash(pipe)
        if have != self.model_hash:
            _, denoiser = find_denoiser(pipe)
            raise AcceleratorError(
                f"the schedule was tuned for model {self.model or '?'} (config hash {self.model_hash}); this "
                f"pipeline's {type(denoiser).__name__} has config hash {have}"
            )
        route = check_sampler(pipe.scheduler, self.sampler)
        facts = PIPELINES.get(type(pipe).__name__)
        passes = facts.passes_sigmas if facts else ""
        flow_sigmas_spared = passes == "unless-flow-sigmas" and pipe.scheduler.config.get("use_flow_sigmas")
        if passes and not flow_sigmas_spared:  # "always", "unless-flow-sigmas", "list", ...
            raise AcceleratorError(
                f"{type(pipe).__name__} passes its own sigmas to {type(pipe.scheduler).__name__}.set_timesteps, "
                "which a schedule does not override"
                + (
                    "; tune and apply flow-dpm++2m or flow-unipc, to which it passes none"
                    if passes == "unless-flow-sigmas"
                    else ""
                )
            )
        return route


class _UsedCheck(ModelHook):
    """Refuses the first denoiser call of a call in which the tuned timesteps were not set."""

    def __init__(self, context, used: dict, name: str):
        super().__init__()
        self.context, self.used, self.name = context, used, name

    def pre_forward(self, module, *args, **kwargs):
        if self.context.denoiser_calls <= 1 and self.used.get("call") != self.context.call_index:
            raise AcceleratorError(
                f"{self.name} did not act: the pipeline's scheduler was replaced after it was applied, or the "
                "pipeline never calls set_timesteps; apply scheduler(...) before timesteps(...)"
            )
        return args, kwargs


@register
@dataclass(frozen=True)
class Schedule(Accelerator):
    """Run the sampler on the timesteps of a ``fastdiff tune-schedule`` JSON file."""

    path: str  # required: a default instance would have nothing to apply

    spec_name = "timesteps"
    renamed_from = ("schedule",)  # "schedule" read too much like "scheduler", a different accelerator
    kind = "sampler"
    touches = frozenset({"scheduler.timesteps", "call.num_inference_steps"})
    exclusive = frozenset({"scheduler.timesteps"})

    def validate(self) -> None:
        if not self.path:
            raise AcceleratorError("schedule: give the JSON written by fastdiff tune-schedule, path=schedule.json")

    def apply(self, fp: FastPipeline) -> Handle:
        tuned = TunedSchedule.load(self.path)
        route = tuned.check(fp.pipe)
        steps = fp._defaults.get("num_inference_steps")
        if steps is not None and steps != tuned.nfe:
            raise AcceleratorError(f"the schedule was tuned for {tuned.nfe} steps; the step default is {steps}")
        used: dict = {}
        handles = [
            install_timesteps(
                fp.pipe.scheduler,
                tuned.timesteps,
                route,
                gate=lambda: fp.context.active,
                on_use=lambda: used.update(call=fp.context.call_index),
            ),
            install_hook(fp.denoiser, _UsedCheck(fp.context, used, str(self)), "fastdiff.schedule", fp.context),
            fp.limit_steps(f"the tuned schedule at {self.path} ({tuned.nfe} steps)", only={tuned.nfe}),
        ]
        if steps is None:
            handles.append(fp.set_call_default("num_inference_steps", tuned.nfe))
        return HandleGroup(handles)
