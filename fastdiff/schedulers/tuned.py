"""Tuned timestep schedules: ``schedule(path=schedule.json)`` runs a sampler on timesteps tuned for the model.

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

Example::

    from fastdiff import FastPipeline
    from fastdiff.schedulers.tuning import tune
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    fp = FastPipeline(GMMPipeline(GMMDenoiser(), default_scheduler()))
    tune(fp.pipe, "dpm++2m", nfe=6, seeds=2, max_evals=100).save("/tmp/schedule.json")
    handle = fp.accelerate("scheduler(name=dpm++2m);schedule(path=/tmp/schedule.json)")
    fp(batch_size=4)  # 6 DPM++2M steps on the tuned timesteps
    handle.remove()  # back to the model's own scheduler and spacing
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, HandleGroup, install_hook
from fastdiff.core.models import find_denoiser, require_prediction
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.schedulers.presets import PRESETS

FORMAT = "fastdiff-schedule/1"
# scheduler class -> how it takes custom timesteps ("timesteps": set_timesteps(timesteps=...); "arrays": see above)
ROUTES = {
    "DPMSolverMultistepScheduler": "timesteps",
    "EulerDiscreteScheduler": "timesteps",
    "UniPCMultistepScheduler": "arrays",
    "DEISMultistepScheduler": "arrays",
}
TUNABLE = ("dpm++2m", "unipc", "deis", "euler")  # deterministic presets, one denoiser call per step
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
}


def untunable_reason(sampler: str) -> str | None:
    """None if ``sampler`` can be tuned, else the refusal (naming why, and the tunable presets)."""
    if sampler in TUNABLE:
        return None
    why = NOT_TUNABLE.get(sampler, "not a sampler preset")
    return f"sampler {sampler!r} cannot be tuned: {why}. Tunable: {', '.join(TUNABLE)}"


def model_hash(pipe) -> str:
    """16 hex digits of sha256 over the denoiser's class and config and the noise schedule it was trained on.

    The noise schedule is the scheduler's float32 ``alphas_cumprod`` (identical for every preset made from the
    model's config) and its prediction type. Weights are not hashed: a retrained model with the same config
    matches.

    >>> from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler
    >>> len(model_hash(GMMPipeline(GMMDenoiser(), default_scheduler())))
    16
    """
    _, denoiser = find_denoiser(pipe)
    config = {k: v for k, v in dict(denoiser.config).items() if not k.startswith("_")}
    scheduler = pipe.scheduler
    noise = hashlib.sha256(scheduler.alphas_cumprod.float().cpu().numpy().tobytes()).hexdigest()
    prediction = scheduler.config.get("prediction_type", "epsilon")
    blob = json.dumps([type(denoiser).__name__, config, noise, prediction], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sigma_table(scheduler) -> torch.Tensor:
    """float32 sigma of every training timestep, computed as diffusers' set_timesteps computes it."""
    alphas_cumprod = scheduler.alphas_cumprod
    return ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5


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
    return ROUTES[cls_name]


def install_timesteps(scheduler, timesteps: list[int], route: str, gate=None, on_use=None) -> Handle:
    """Make ``scheduler.set_timesteps(len(timesteps))`` set ``timesteps`` (only while ``gate()`` if given).

    A call with another step count raises; explicit ``timesteps=``/``sigmas=`` from the caller pass through.
    ``on_use()`` runs each time the tuned timesteps are set. The Handle removes the instance attribute.
    """
    if "set_timesteps" in scheduler.__dict__:
        raise AcceleratorError(
            f"{type(scheduler).__name__}.set_timesteps is already replaced (another schedule?)"
        )
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
    timesteps: list[int]
    sigmas: list[float]  # noise level of each timestep, then the sampler's final one
    model: str = ""
    objective: dict = field(default_factory=dict)  # reference, seeds, start and tuned values, candidates
    log: list = field(default_factory=list)  # [evaluations, best objective] at each improvement
    format: str = FORMAT

    def __post_init__(self):
        ts = [int(t) for t in self.timesteps]
        if len(ts) != self.nfe or any(a <= b for a, b in zip(ts, ts[1:])) or ts[-1] < 0:
            raise AcceleratorError(f"timesteps {ts} are not {self.nfe} strictly decreasing values >= 0")
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
        """Refuse another model or sampler (naming the mismatch); return the scheduler's route."""
        have = model_hash(pipe)
        if have != self.model_hash:
            _, denoiser = find_denoiser(pipe)
            raise AcceleratorError(
                f"the schedule was tuned for model {self.model or '?'} (config hash {self.model_hash}); this "
                f"pipeline's {type(denoiser).__name__} has config hash {have}"
            )
        return check_sampler(pipe.scheduler, self.sampler)


class _UsedCheck(ModelHook):
    """Refuses the first denoiser call of a call in which the tuned timesteps were not set."""

    def __init__(self, context, used: dict, name: str):
        super().__init__()
        self.context, self.used, self.name = context, used, name

    def pre_forward(self, module, *args, **kwargs):
        if self.context.denoiser_calls <= 1 and self.used.get("call") != self.context.call_index:
            raise AcceleratorError(
                f"{self.name} did not act: the pipeline's scheduler was replaced after it was applied, or the "
                "pipeline never calls set_timesteps; apply scheduler(...) before schedule(...)"
            )
        return args, kwargs


@register
@dataclass(frozen=True)
class Schedule(Accelerator):
    """Run the sampler on the timesteps of a ``fastdiff tune-schedule`` JSON file."""

    path: str  # required: a default instance would have nothing to apply

    spec_name = "schedule"
    kind = "sampler"
    touches = frozenset({"scheduler.timesteps", "call.num_inference_steps"})
    exclusive = frozenset({"scheduler.timesteps"})

    def validate(self) -> None:
        if not self.path:
            raise AcceleratorError(
                "schedule: give the JSON written by fastdiff tune-schedule, path=schedule.json"
            )

    def apply(self, fp) -> Handle:
        require_prediction(fp, "schedule")  # tuned timesteps index a noise schedule's alpha-bar table
        tuned = TunedSchedule.load(self.path)
        route = tuned.check(fp.pipe)
        steps = fp._defaults.get("num_inference_steps")
        if steps is not None and steps != tuned.nfe:
            raise AcceleratorError(
                f"the schedule was tuned for {tuned.nfe} steps; the step default is {steps}"
            )
        used: dict = {}
        handles = [
            install_timesteps(
                fp.pipe.scheduler,
                tuned.timesteps,
                route,
                gate=lambda: fp.context.active,
                on_use=lambda: used.update(call=fp.context.call_index),
            ),
            install_hook(
                fp.denoiser, _UsedCheck(fp.context, used, str(self)), "fastdiff.schedule", fp.context
            ),
        ]
        if steps is None:
            handles.append(fp.set_call_default("num_inference_steps", tuned.nfe))
        return HandleGroup(handles)
