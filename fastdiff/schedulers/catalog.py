"""The sampler presets as data (no torch, no diffusers): ``fastdiff.schedulers.presets`` applies them; the
command line lists them without loading the library.

Example::

    from fastdiff.schedulers.catalog import PRESETS
    print(PRESETS["dpm++2m"])   # ('DPMSolverMultistepScheduler', {...}, 'best default for 10-25 steps')
"""

from __future__ import annotations

_TRAILING = {"timestep_spacing": "trailing"}
_DPM = {"algorithm_type": "dpmsolver++", "solver_order": 2, **_TRAILING}

# preset -> (diffusers class, flags set over the model's config, when to use it)
PRESETS: dict[str, tuple[str, dict, str]] = {
    "ddim": (
        "DDIMScheduler",
        {"clip_sample": False, "set_alpha_to_one": True, **_TRAILING},
        "deterministic baseline; 50 steps is the usual reference",
    ),
    "ddpm": (
        "DDPMScheduler",
        {"clip_sample": False, **_TRAILING},
        "ancestral sampling as trained; needs ~1000 steps",
    ),
    "pndm": ("PNDMScheduler", {"skip_prk_steps": True, **_TRAILING}, "SD's original default; 50 steps"),
    "euler": ("EulerDiscreteScheduler", _TRAILING, "simple deterministic ODE solver; 30+ steps"),
    "euler-a": ("EulerAncestralDiscreteScheduler", _TRAILING, "stochastic, varied images; 20-30 steps"),
    "heun": ("HeunDiscreteScheduler", _TRAILING, "2nd order, 2 NFE per step; accurate at 10-20 steps"),
    "dpm++2m": ("DPMSolverMultistepScheduler", _DPM, "best default for 10-25 steps"),
    "dpm++2m-karras": (
        "DPMSolverMultistepScheduler",
        {**_DPM, "use_karras_sigmas": True},
        "Karras sigmas; often sharper at 10-20 steps",
    ),
    "dpm++2m-sde": (
        "DPMSolverMultistepScheduler",
        {**_DPM, "algorithm_type": "sde-dpmsolver++"},
        "stochastic DPM++; more detail at 20-30 steps",
    ),
    "dpm++sde": ("DPMSolverSDEScheduler", {**_TRAILING}, "stochastic, 2 NFE per step; 10-20 steps"),
    "unipc": ("UniPCMultistepScheduler", _TRAILING, "predictor-corrector; best at 5-10 steps"),
    "deis": ("DEISMultistepScheduler", _TRAILING, "exponential integrator; 10-20 steps"),
    "lcm": ("LCMScheduler", {}, "only for LCM-distilled models; 1-8 steps"),
    "flow-euler": ("FlowMatchEulerDiscreteScheduler", {}, "flow models' own Euler; 28-50 steps"),
    "flow-heun": ("FlowMatchHeunDiscreteScheduler", {}, "2nd order flow Euler, 2 NFE per step"),
    "flow-dpm++2m": (
        "DPMSolverMultistepScheduler",
        {**_DPM, "prediction_type": "flow_prediction", "use_flow_sigmas": True},
        "DPM-Solver++ 2M on flow sigmas; 10-20 steps",
    ),
    "flow-unipc": (
        "UniPCMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True},
        "UniPC on flow sigmas; 5-10 steps",
    ),
}
FLOW_PRESETS = frozenset(name for name in PRESETS if name.startswith("flow-"))
# deterministic presets, one denoiser call per step, whose timesteps ``schedule`` can tune
TUNABLE = ("dpm++2m", "unipc", "deis", "euler", "flow-euler", "flow-dpm++2m", "flow-unipc")
