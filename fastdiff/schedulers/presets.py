"""Sampler presets: ``scheduler(name=..., steps=N)`` swaps in a diffusers scheduler built ``from_config``.

The new scheduler keeps the model's betas and prediction type (``from_config`` of the current one); the flags
below are set on top. ``steps`` becomes the default ``num_inference_steps``. ``remove()`` puts the original
scheduler object back.

Flow-matching models (SD3, Flux, Qwen-Image, Z-Image, Sana) predict a velocity, not noise: they take the
``flow-*`` presets, which carry the model's shift (or its resolution-dependent dynamic shifting) over, and
every other preset is refused on them, as the ``flow-*`` presets are on noise-predicting models.

Example::

    fp.accelerate("scheduler(name=unipc,steps=10)")
    fp(prompt="a cat")  # 10 UniPC steps
"""

from __future__ import annotations

import copy
import inspect
import json
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import diffusers

from fastdiff.core.hooks import Handle, HandleGroup
from fastdiff.core.models import PIPELINES
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.schedulers.catalog import FLOW_PRESETS, PRESETS

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

# the FlowMatch classes convert passed sigmas with np.array; UniPC multiplies a passed Python list as it is
TAKES_LIST_SIGMAS = frozenset({"flow-euler", "flow-heun"})
# DPMSolverMultistepScheduler.set_timesteps asserts use_dynamic_shifting whenever it is given a mu
ASSERTS_DYNAMIC_MU = frozenset({"flow-dpm++2m"})

# What a flow model was trained with (shift and dynamic shifting); the pipeline reads the *_shift / *_seq_len keys
# from the scheduler's config to compute the dynamic shift, so they travel even to classes that do not declare them.
FLOW_KEYS = (
    "num_train_timesteps",
    "use_dynamic_shifting",
    "base_shift",
    "max_shift",
    "base_image_seq_len",
    "max_image_seq_len",
    "time_shift_type",
    "shift_terminal",
)

# Presets that fail on torch-xla devices: torchsde's BrownianTree refuses the XLA device type.
NOT_ON_XLA = frozenset({"dpm++sde"})

PresetName = Literal[
    "ddim",
    "ddpm",
    "pndm",
    "euler",
    "euler-a",
    "heun",
    "dpm++2m",
    "dpm++2m-karras",
    "dpm++2m-sde",
    "dpm++sde",
    "unipc",
    "deis",
    "lcm",
    "flow-euler",
    "flow-heun",
    "flow-dpm++2m",
    "flow-unipc",
]


def make_scheduler(name: str, config) -> object:
    """Build preset ``name`` from a scheduler config (keeps betas and prediction type)."""
    if name not in PRESETS:
        raise AcceleratorError(f"unknown scheduler preset {name!r}; choose one of {', '.join(PRESETS)}")
    cls_name, flags, _ = PRESETS[name]
    config = flow_config(config, cls_name) if name in FLOW_PRESETS else explicit_config(config, cls_name)
    key = (
        name,
        json.dumps(config, sort_keys=True, default=lambda v: v.tolist() if hasattr(v, "tolist") else repr(v)),
    )
    if key not in _PROTOTYPES:
        # diffusers' from_config inspects signatures on every call (~1 ms); a server switching profiles per
        # request builds the same schedulers again and again, so build each once and hand out copies
        if len(_PROTOTYPES) >= 64:
            _PROTOTYPES.clear()
        verbosity = diffusers.utils.logging.get_verbosity()
        diffusers.utils.logging.set_verbosity_error()  # a flow model's shift keys are kept on purpose
        try:
            _PROTOTYPES[key] = getattr(diffusers, cls_name).from_config(config, **flags)
        finally:
            diffusers.utils.logging.set_verbosity(verbosity)
    return copy.deepcopy(_PROTOTYPES[key])


_PROTOTYPES: dict[tuple[str, str], object] = {}


# What the model was trained with: kept when a scheduler is rebuilt as another class (solver options are not)
MODEL_KEYS = frozenset(
    {
        "num_train_timesteps",
        "beta_start",
        "beta_end",
        "beta_schedule",
        "trained_betas",
        "prediction_type",
        "steps_offset",
        "timestep_spacing",
        "rescale_betas_zero_snr",
        "clip_sample",
        "clip_sample_range",
        "thresholding",
        "dynamic_thresholding_ratio",
        "sample_max_value",
        "set_alpha_to_one",
    }
)


def explicit_config(config, target: str | None = None) -> dict:
    """``config`` with every value made explicit; for another class ``target``, only the ``MODEL_KEYS``.

    diffusers' ``from_config`` replaces the keys listed in ``_use_default_values`` (those a scheduler built in
    memory left at its defaults) by the *new* class's defaults, which changes the betas, e.g. DDPM -> LCM. A
    solver's own options do not carry over to another class (DEIS's ``algorithm_type="deis"`` is no value for
    DPM-Solver, DPM-Solver's ``sde-dpmsolver++`` none for DEIS): the new class takes its defaults.
    """
    config = dict(config)
    keep = (lambda key: key in MODEL_KEYS) if target and config.get("_class_name") != target else (lambda key: True)
    return {key: value for key, value in config.items() if key != "_use_default_values" and keep(key)}


def flow_config(config, target: str) -> dict:
    """A flow model's scheduler settings for class ``target``: its shift (``shift`` in the FlowMatch classes,
    ``flow_shift`` in DPM-Solver and UniPC) and dynamic-shifting keys."""
    config = dict(config)
    shift = config["shift"] if "shift" in config else config.get("flow_shift", 1.0)
    out = {key: config[key] for key in FLOW_KEYS if config.get(key) is not None}
    out["shift" if target.startswith("FlowMatch") else "flow_shift"] = shift
    if out.get("use_dynamic_shifting") and out.get("time_shift_type", "exponential") != "exponential":
        if not target.startswith("FlowMatch"):
            raise AcceleratorError(
                f"{target} shifts only exponentially; this model's dynamic shifting is {out['time_shift_type']} "
                "(use flow-euler)"
            )
    return out


def check_prediction(preset: str, scheduler, fp) -> None:
    """Refuse a preset whose solver assumes another model output than the model's (flow velocity vs noise)."""
    from fastdiff.core.models import family_name, model_prediction

    predicts = model_prediction(scheduler)
    flow = preset in FLOW_PRESETS
    if flow != (predicts == "flow"):
        others = sorted(FLOW_PRESETS) if predicts == "flow" else sorted(set(PRESETS) - FLOW_PRESETS)
        wants = "flow velocity" if flow else "noise, v or sample (a DDPM-style model)"
        raise AcceleratorError(
            f"scheduler(name={preset}) solves for a model that predicts {wants}, but the {family_name(fp.pipe)} "
            f"model's {type(fp.denoiser).__name__} predicts {predicts} (its scheduler: "
            f"{type(scheduler).__name__}); presets for it: {', '.join(others)}"
        )


def check_sigmas(preset: str, pipe, scheduler) -> None:
    """Refuse a preset that cannot take what the pipeline hands its scheduler (its own sigmas, a dynamic-shift
    mu, img2img's scale_noise) or the model's dynamic shifting, naming the presets that can."""
    reason = sampler_problem(preset, pipe, scheduler)
    if reason:
        able = [n for n in PRESETS if (n in FLOW_PRESETS) == (preset in FLOW_PRESETS)]
        able = [n for n in able if n != "lcm" and not sampler_problem(n, pipe, scheduler)]
        raise AcceleratorError(f"scheduler(name={preset}): {reason}; presets that fit: {', '.join(able) or 'none'}")


def sampler_problem(preset: str, pipe, scheduler) -> str | None:
    """Why preset ``preset`` cannot sample ``pipe`` (whose model's scheduler is ``scheduler``), or None."""
    facts = PIPELINES.get(type(pipe).__name__)
    cls_name = PRESETS[preset][0]
    cls = getattr(diffusers, cls_name)
    if facts is not None and not _takes_passed_sigmas(preset, facts.passes_sigmas):
        return f"{type(pipe).__name__} passes its own sigmas to the scheduler, which {cls_name} cannot take"
    missing = [m for m in (facts.scheduler_methods if facts else ()) if not hasattr(cls, m)]
    if missing:
        return f"{type(pipe).__name__} calls the scheduler's {', '.join(missing)}, which {cls_name} lacks"
    dynamic = scheduler.config.get("use_dynamic_shifting")
    if preset in ASSERTS_DYNAMIC_MU and facts is not None and facts.passes_mu and not dynamic:
        return (
            f"{type(pipe).__name__} passes a dynamic-shift mu, which {cls_name} takes only for models with "
            "dynamic shifting, and this one has none"
        )
    if preset in FLOW_PRESETS and dynamic and "use_dynamic_shifting" not in _init_params(cls_name):
        return (
            f"{type(pipe).__name__}'s model shifts its timesteps by image size (use_dynamic_shifting), "
            f"which {cls_name} cannot do"
        )
    reshaped = [k for k in SCHEDULE_SHAPING if scheduler.config.get(k) and k not in _init_params(cls_name)]
    if reshaped:  # from_config would drop the key and sample another noise schedule than the model's
        settings = ", ".join(f"{k}={scheduler.config[k]}" for k in reshaped)
        return (
            f"the model's {type(scheduler).__name__} reshapes its noise schedule ({settings}), which {cls_name} cannot"
        )
    return None


# Scheduler settings that change the noise schedule itself (CogVideoX's SNR shift, zero-terminal-SNR betas): a
# preset class without them would sample another schedule than the model was trained on.
SCHEDULE_SHAPING = ("snr_shift_scale", "rescale_betas_zero_snr")


def _takes_passed_sigmas(preset: str, passes: str) -> bool:
    cls_name, flags, _ = PRESETS[preset]
    if not passes or (passes == "unless-flow-sigmas" and flags.get("use_flow_sigmas")):
        return True
    if passes == "list" and preset not in TAKES_LIST_SIGMAS:
        return False
    return "sigmas" in inspect.signature(getattr(diffusers, cls_name).set_timesteps).parameters


def _init_params(cls_name: str):
    return inspect.signature(getattr(diffusers, cls_name)).parameters


@register
@dataclass(frozen=True)
class Scheduler(Accelerator):
    """Swap the sampler for a preset and default the step count."""

    name: PresetName = "dpm++2m"
    steps: int | None = option(None, ge=1)

    spec_name = "scheduler"
    kind = "sampler"
    touches = frozenset({"scheduler", "call.num_inference_steps"})
    exclusive = frozenset({"scheduler"})
    # every preset but NOT_ON_XLA ran on torch-xla in tests/xla/test_xla.py
    runs_on_xla = property(lambda self: self.name not in NOT_ON_XLA)

    def validate(self) -> None:
        if self.name not in PRESETS:
            raise AcceleratorError(f"scheduler: unknown preset {self.name!r}; choose one of {', '.join(PRESETS)}")

    def apply(self, fp: FastPipeline) -> Handle:
        pipe = fp.pipe
        original = pipe.scheduler
        check_prediction(self.name, original, fp)
        check_sigmas(self.name, pipe, original)
        if self.name == "lcm" and getattr(fp.denoiser.config, "time_cond_proj_dim", None) is None:
            warnings.warn(
                "scheduler(name=lcm) expects an LCM-distilled model (time_cond_proj_dim set); "
                f"{type(fp.denoiser).__name__} is not one, so expect poor images",
                stacklevel=3,
            )
        pipe.scheduler = make_scheduler(self.name, original.config)

        def restore():
            pipe.scheduler = original

        handles = [Handle(restore)]
        if self.steps is not None:
            handles.append(fp.set_call_default("num_inference_steps", self.steps))
        return HandleGroup(handles)
