"""Search spaces for the tuner: sampler presets x steps x accelerator options, as plain (YAML-able) data.

A space is a mapping (a YAML file for ``fastdiff tune --space``)::

    baseline: "scheduler(name=dpm++2m,steps=20)"   # what budgets are relative to ("dpm++2m 20" works too)
    samplers: [dpm++2m, unipc]                     # presets of fastdiff.schedulers.presets
    steps: [5, 8, 10, 20]
    axes:                                          # each axis contributes one option per candidate
      cache: ["", "deepcache(interval=3)", "forecast(order=2,interval=3,warmup=3)"]   # "" = nothing
      guidance: ["", "cfg-interval(start=0.0,end=0.4)"]
    models:                                        # replace sampler x steps: other weights (students ...)
      - "student(path=/work/students/cons-g2,steps={steps})"   # {steps} expands over model_steps
    model_steps: [1, 2, 4]
    combine_models: true                           # combine models with the axes too
    settings: {images: 500, rungs: [50, 150, 500], eta: 3, runs: 1, grid_max: 12}

Candidates are the product of (sampler x steps, plus the models) and one option of every axis. Combinations
with a declared conflict (``fastdiff.core.registry.conflict_reason``) are pruned before anything runs, and
so are guidance-kind accelerators when the call has no classifier-free guidance (guidance <= 1). A model entry
whose ``path=`` does not exist yet is skipped and listed (students still in training).

Example::

    from fastdiff.tune.space import default_space, load_space

    space = load_space(default_space("digits"))
    candidates, pruned = space.candidates(cfg=True)
    print(len(candidates), candidates[0], pruned)
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdiff.core.registry import AcceleratorError, apply_order, conflict_reason
from fastdiff.core.spec import parse

CACHES_UNET = ["", "deepcache(interval=2)", "deepcache(interval=3)", "forecast(order=2,interval=3,warmup=3)"]
CFG_WINDOWS = ["", "cfg-interval(start=0.0,end=0.4)", "cfg-interval(start=0.0,end=0.5)"]

DEFAULT_SPACES: dict[str, dict[str, Any]] = {
    "digits": {
        "baseline": "scheduler(name=dpm++2m,steps=20)",
        "samplers": ["dpm++2m", "unipc"],
        "steps": [4, 5, 6, 8, 10, 15, 20],
        "axes": {"cache": CACHES_UNET, "guidance": CFG_WINDOWS},
        "settings": {"images": 500, "rungs": [50, 150, 500], "eta": 3},
    },
    "unet": {
        "baseline": "scheduler(name=dpm++2m,steps=20)",
        "samplers": ["dpm++2m", "unipc", "dpm++2m-karras"],
        "steps": [5, 8, 10, 15, 20],
        "axes": {
            "cache": CACHES_UNET,
            "guidance": CFG_WINDOWS,
            "attention": ["", "tome(ratio=0.5)"],
        },
        "settings": {"images": None, "rungs": None, "eta": 3},
    },
    "dit": {
        "baseline": "scheduler(name=dpm++2m,steps=20)",
        "samplers": ["dpm++2m", "unipc"],
        "steps": [5, 8, 10, 15, 20],
        "axes": {
            "cache": [
                "",
                "blockcache(mode=interval,interval=2)",
                "blockcache(mode=interval,interval=3)",
                "forecast(order=2,interval=3,warmup=3)",
            ],
            "guidance": CFG_WINDOWS,
        },
        "settings": {"images": None, "rungs": None, "eta": 3},
    },
    "flow": {  # flow-matching transformers (SD3, Flux, digits-flow): flow presets, block caches
        "baseline": "scheduler(name=flow-euler,steps=28)",
        "samplers": ["flow-euler", "flow-dpm++2m", "flow-unipc"],
        "steps": [4, 6, 8, 10, 14, 20],
        "axes": {
            "cache": [
                "",
                "blockcache(mode=interval,interval=2)",
                "blockcache(mode=teacache,threshold=0.12)",
                "forecast(order=1,interval=2,warmup=2)",
                "forecast(order=1,interval=3,warmup=3)",
            ],
            "guidance": CFG_WINDOWS,
        },
        "settings": {"images": None, "rungs": None, "eta": 3},
    },
    "samplers": {  # models without skip branches or blocks to cache (e.g. the exact-score GMM)
        "baseline": "scheduler(name=dpm++2m,steps=20)",
        "samplers": ["dpm++2m", "dpm++2m-karras", "unipc", "deis", "ddim", "euler"],
        "steps": [5, 8, 10, 15, 20],
        "axes": {},
        "settings": {"images": None, "rungs": None, "eta": 3},
    },
}

SETTINGS_DEFAULTS: dict[str, Any] = {
    "images": None,  # full measurement: images per call (None: the model's bench batch)
    "rungs": None,  # image counts of the successive-halving rungs, ending with images (None: derived)
    "eta": 3,  # keep 1/eta of the candidates at each rung
    "min_keep": 3,  # never keep fewer than this many at a rung (when there are that many)
    "runs": 1,  # timed runs per measurement (as fastdiff bench --runs)
    "warmup": False,  # untimed warm-up call per measurement (as fastdiff bench without --no-warmup)
    "grid_max": 12,  # spaces with at most this many candidates are measured in full directly (grid)
}
KEYS = {
    "baseline",
    "samplers",
    "steps",
    "axes",
    "models",
    "model_steps",
    "combine_models",
    "settings",
    "family",
}
_SHORT_BASELINE = re.compile(r"^\s*([A-Za-z][\w+\-]*)\s+(\d+)\s*$")


class SpaceError(ValueError):
    """A search space that cannot be used, naming the entry at fault."""


def default_space(family: str) -> dict[str, Any]:
    """A copy of the default space of a model family (``digits``, ``unet``, ``dit``, ``flow``, ``samplers``)."""
    if family not in DEFAULT_SPACES:
        raise SpaceError(f"no default space for family {family!r}; known: {', '.join(DEFAULT_SPACES)}")
    return copy.deepcopy(DEFAULT_SPACES[family]) | {"family": family}


def family_of(pipe) -> str:
    """The default-space family of a diffusers pipeline: digits, flow, dit, unet or samplers."""
    from fastdiff.core.models import find_denoiser, model_prediction

    if type(pipe).__name__ == "ClassConditionalPipeline":
        return "digits"
    name, denoiser = find_denoiser(pipe)
    if name == "transformer" and model_prediction(pipe.scheduler) == "flow":
        return "flow"
    if name == "transformer":
        return "dit"
    if "UNet" in type(denoiser).__name__:
        return "unet"
    return "samplers"


def baseline_spec(text: str) -> str:
    """A spec string for the baseline: a spec, or ``"SAMPLER STEPS"`` (``"dpm++2m 20"``, ``"ddim 50"``)."""
    short = _SHORT_BASELINE.match(text)
    if short:
        text = f"scheduler(name={short[1]},steps={short[2]})"
    return canonical(text, "baseline")


def canonical(spec: str, where: str) -> str:
    """The spec in fastdiff's own spelling and apply order (equal configs give equal strings)."""
    try:
        configs = parse(spec)
    except AcceleratorError as error:
        raise SpaceError(f"{where}: {spec!r} is not a valid accelerator spec: {error}") from None
    return ";".join(str(c) for c in apply_order(configs))


@dataclass
class Space:
    """A validated search space; ``candidates()`` enumerates and prunes it."""

    baseline: str
    samplers: list[str]
    steps: list[int]
    axes: dict[str, list[str]]
    models: list[str] = field(default_factory=list)
    combine_models: bool = True
    settings: dict[str, Any] = field(default_factory=lambda: dict(SETTINGS_DEFAULTS))
    family: str | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)  # model entries not available

    def candidates(self, cfg: bool = True) -> tuple[list[str], dict[str, int]]:
        """Unique candidate specs (baseline excluded) and counts of pruned combinations by reason."""
        bases = [canonical(f"scheduler(name={s},steps={n})", "sampler") for s in self.samplers for n in self.steps]
        axes = {name: options for name, options in self.axes.items()}
        if not cfg:  # no classifier-free guidance in the call: guidance-kind accelerators would do nothing
            axes = {n: [o for o in opts if not _kind(o, "guidance")] or [""] for n, opts in axes.items()}
        combos = list(itertools.product(*axes.values())) or [()]
        seeds = [(b, combos) for b in bases] + [(m, combos if self.combine_models else [()]) for m in self.models]
        out, seen, pruned = [], {self.baseline}, {}
        for base, options in seeds:
            for combo in options:
                configs = parse(";".join(p for p in (base, *combo) if p))
                reason = _first_conflict(configs)
                if reason:
                    pruned[reason] = pruned.get(reason, 0) + 1
                    continue
                spec = ";".join(str(c) for c in apply_order(configs))
                if spec not in seen:
                    seen.add(spec)
                    out.append(spec)
        return out, pruned

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "baseline": self.baseline,
            "samplers": self.samplers,
            "steps": self.steps,
            "axes": self.axes,
            "models": self.models,
            "combine_models": self.combine_models,
            "settings": self.settings,
            "skipped": self.skipped,
        }


def _kind(spec: str, kind: str) -> bool:
    return bool(spec) and any(c.kind == kind for c in parse(spec))


def _first_conflict(configs) -> str | None:
    for i, a in enumerate(configs):
        for b in configs[:i]:
            reason = conflict_reason(a, b)
            if reason:
                return f"{b.spec_name} + {a.spec_name}: {reason}"
    return None


def load_space(source: str | Path | dict, baseline: str | None = None) -> Space:
    """Validate a space from a mapping or a YAML file; raise SpaceError naming the problem."""
    where = "space"
    if not isinstance(source, dict):
        import yaml

        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise SpaceError(f"space file {where!r} does not exist")
        try:
            source = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise SpaceError(f"{where}: not valid YAML: {error}") from None
        if not isinstance(source, dict):
            raise SpaceError(f"{where}: expected a mapping with samplers/steps/axes, got {type(source).__name__}")
    unknown = set(source) - KEYS
    if unknown:
        raise SpaceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(KEYS))}")
    from fastdiff.schedulers.presets import PRESETS

    samplers = _list(source.get("samplers", []), f"{where}: samplers")
    for name in samplers:
        if name not in PRESETS:
            raise SpaceError(f"{where}: unknown sampler preset {name!r}; choose from {', '.join(PRESETS)}")
    steps = _steps(source.get("steps", []), f"{where}: steps")
    if samplers and not steps:
        raise SpaceError(f"{where}: samplers are given but no steps")
    axes_in = source.get("axes") or {}
    if not isinstance(axes_in, dict):
        raise SpaceError(f"{where}: axes must be a mapping of axis name -> list of specs")
    axes = {}
    for name, options in axes_in.items():
        options = [("" if o is None else str(o)) for o in _list(options, f"{where}: axis {name!r}")]
        if not options:
            raise SpaceError(f"{where}: axis {name!r} has no options (use [\"\"] for 'nothing')")
        axes[str(name)] = [canonical(o, f"{where}: axis {name!r}") if o.strip() else "" for o in options]
    models, skipped = _models(source, where)
    if not samplers and not models:
        raise SpaceError(f"{where}: the space is empty: give samplers and steps, or models")
    settings = dict(SETTINGS_DEFAULTS)
    extra = source.get("settings") or {}
    if not isinstance(extra, dict) or set(extra) - set(SETTINGS_DEFAULTS):
        bad = sorted(set(extra) - set(SETTINGS_DEFAULTS)) if isinstance(extra, dict) else extra
        raise SpaceError(f"{where}: unknown settings {bad}; allowed: {', '.join(SETTINGS_DEFAULTS)}")
    settings.update(extra)
    _check_settings(settings, where)
    base = baseline or source.get("baseline") or "scheduler(name=dpm++2m,steps=20)"
    try:
        base = baseline_spec(str(base))
    except SpaceError as error:
        raise SpaceError(f"{where}: {error}") from None
    return Space(
        base,
        samplers,
        steps,
        axes,
        models,
        bool(source.get("combine_models", True)),
        settings,
        source.get("family"),
        skipped,
    )


def _list(value, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int)):
        return [value]
    if not isinstance(value, list):
        raise SpaceError(f"{where}: expected a list, got {type(value).__name__}")
    return list(value)


def _steps(value, where: str) -> list[int]:
    steps = _list(value, where)
    for n in steps:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise SpaceError(f"{where}: {n!r} is not a positive integer number of steps")
    return sorted(set(steps))


def _models(source: dict, where: str) -> tuple[list[str], list[dict[str, str]]]:
    model_steps = _steps(source.get("model_steps", []), f"{where}: model_steps")
    models, skipped = [], []
    for entry in _list(source.get("models", []), f"{where}: models"):
        entry = str(entry)
        if "{steps}" in entry and not model_steps:
            raise SpaceError(f"{where}: model {entry!r} uses {{steps}} but model_steps is not given")
        for spec in [entry.replace("{steps}", str(n)) for n in model_steps] if "{steps}" in entry else [entry]:
            missing = [p for p in re.findall(r"path=([^,;)]+)", spec) if not Path(p).expanduser().exists()]
            if missing:
                skipped.append({"spec": spec, "reason": f"{missing[0]} does not exist (yet)"})
                continue
            models.append(canonical(spec, f"{where}: model"))
    return models, skipped


def _check_settings(settings: dict, where: str) -> None:
    for key in ("eta", "min_keep", "runs", "grid_max"):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (2 if key == "eta" else 1):
            raise SpaceError(
                f"{where}: settings.{key} must be an integer >= {2 if key == 'eta' else 1}, got {value!r}"
            )
    images = settings["images"]
    if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 2):
        raise SpaceError(f"{where}: settings.images must be an integer >= 2, got {images!r}")
    rungs = settings["rungs"]
    if rungs is not None:
        rungs = _steps(rungs, f"{where}: settings.rungs")
        if images is not None and rungs[-1] != images:
            raise SpaceError(f"{where}: settings.rungs must end with settings.images ({images}), got {rungs}")
        settings["rungs"] = rungs
    if not isinstance(settings["warmup"], bool):
        raise SpaceError(f"{where}: settings.warmup must be true or false")
