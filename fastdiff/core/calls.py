"""Checks of a pipeline call's arguments against the model and its scheduler, before any model work.

A bad value raises ``CallArgumentError`` (a ``ValueError``) naming the argument, the value and what is allowed;
the server turns it into a 422 naming its own field.

Example::

    from fastdiff.core.calls import max_steps
    max_steps(pipe.scheduler)   # 999 for SD's DDIM (leading spacing, steps_offset=1)
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass

import torch


class CallArgumentError(ValueError):
    """A call argument the model or its scheduler cannot take; ``argument`` and ``value`` name it."""

    def __init__(self, argument: str, value, allowed: str):
        super().__init__(f"{argument}={value!r} is not allowed: {allowed}")
        self.argument, self.value, self.allowed = argument, value, allowed


def max_steps(scheduler) -> int | None:
    """The largest ``num_inference_steps`` the scheduler's own ``set_timesteps`` can serve: every timestep inside
    its training range and as many distinct ones as steps (None: no limit found, e.g. flow schedulers)."""
    config = scheduler.config
    train = config.get("num_train_timesteps")
    if not isinstance(train, int) or "FlowMatch" in type(scheduler).__name__ or config.get("use_flow_sigmas"):
        return None
    key = json.dumps({k: v for k, v in config.items() if not k.startswith("_")}, sort_keys=True, default=str)
    return _max_steps(type(scheduler), key, train)  # type: ignore[arg-type]  # a class hashes by identity


@functools.lru_cache(maxsize=64)
def _max_steps(cls, key: str, train: int) -> int:
    prototype = cls.from_config(json.loads(key))

    def fits(steps: int) -> bool:
        trial = copy.deepcopy(prototype)
        try:
            trial.set_timesteps(steps)
        except (ValueError, IndexError, RuntimeError):
            return False
        timesteps = torch.as_tensor(trial.timesteps).flatten()
        return bool(timesteps.numel() and timesteps.max() < train and timesteps.min() >= 0)

    if fits(train):
        return train
    low, high = 1, train  # fits(low) is assumed; the largest count that fits, by bisection
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def check_steps(scheduler, steps, limits=()) -> None:
    """``steps`` against the scheduler's own range and every accelerator's ``StepLimit``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise CallArgumentError("num_inference_steps", steps, "a positive integer")
    if steps < 2 and scheduler.config.get("shift_terminal"):
        raise CallArgumentError(
            "num_inference_steps",
            steps,
            f"at least 2 with this {type(scheduler).__name__}: stretching one "
            f"sigma to shift_terminal={scheduler.config.get('shift_terminal')} divides by zero (NaN images)",
        )
    for step_limit in limits:
        if (problem := step_limit.problem(steps)) is not None:
            raise CallArgumentError("num_inference_steps", steps, problem)
    limit = max_steps(scheduler)
    if limit is not None and steps > limit:
        raise CallArgumentError(
            "num_inference_steps",
            steps,
            f"at most {limit} with this {type(scheduler).__name__} "
            f"({scheduler.config.get('num_train_timesteps')} training steps, "
            f"{scheduler.config.get('timestep_spacing', 'its')} spacing)",
        )


def check_size(key: str, size, factor: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % factor:
        raise CallArgumentError(key, size, f"a positive multiple of {factor} for this model")


def check_ignored_guidance(guidance, default, denoiser, flag: str) -> None:
    """A ``guidance_scale`` above 1 (other than the pipeline's own default) to a model without the guidance
    input ``flag`` (FLUX.1-schnell): diffusers would drop it without a word."""
    if not flag or guidance is None or guidance == default or guidance <= 1:
        return
    if getattr(denoiser.config, flag, True):
        return
    raise CallArgumentError(
        "guidance_scale",
        guidance,
        f"at most 1, unset or the pipeline default ({default}): this {type(denoiser).__name__} has "
        f"{flag}=False (not guidance-distilled, like FLUX.1-schnell) and ignores guidance_scale; for "
        "classifier-free guidance give true_cfg_scale > 1 with a negative_prompt",
    )


@dataclass(frozen=True)
class StepLimit:
    """What one accelerator lets ``num_inference_steps`` be: ``only`` these counts, or at most ``maximum``."""

    source: str
    only: frozenset[int] | None = None
    maximum: int | None = None

    def problem(self, steps: int) -> str | None:
        if self.only is not None and steps not in self.only:
            return f"{self.source} allows only {_counts(self.only)}"
        if self.maximum is not None and steps > self.maximum:
            return f"{self.source} allows at most {self.maximum}"
        return None


def allowed_steps(scheduler, limits=()) -> StepLimit:
    """Every limit together: the scheduler's own largest count and each accelerator's ``StepLimit``."""
    maximum, only = max_steps(scheduler), None
    for limit in limits:
        if limit.maximum is not None:
            maximum = limit.maximum if maximum is None else min(maximum, limit.maximum)
        if limit.only is not None:
            only = limit.only if only is None else only & limit.only
    if only is not None and maximum is not None:
        only = frozenset(n for n in only if n <= maximum)
    return StepLimit("together", only, maximum)


def _counts(counts) -> str:
    return ", ".join(map(str, sorted(counts))) or "no step count"


OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def check_call_values(kwargs: dict, batch: int | None) -> None:
    """Guidance, images per prompt, the generator list and ``output_type`` (diffusers would take an unknown
    ``output_type`` as "np" with a warning, and find a short generator list only after encoding the prompt)."""
    guidance = kwargs.get("guidance_scale")
    if guidance is not None and (
        isinstance(guidance, bool) or not isinstance(guidance, (int, float)) or not math.isfinite(guidance)
    ):
        raise CallArgumentError("guidance_scale", guidance, "a finite number")
    per_prompt = kwargs.get("num_images_per_prompt")
    if per_prompt is not None and (isinstance(per_prompt, bool) or not isinstance(per_prompt, int) or per_prompt < 1):
        raise CallArgumentError("num_images_per_prompt", per_prompt, "a positive integer")
    output_type = kwargs.get("output_type")
    if output_type is not None and output_type not in OUTPUT_TYPES:
        raise CallArgumentError("output_type", output_type, f"one of {', '.join(OUTPUT_TYPES)}")
    generator = kwargs.get("generator")
    if isinstance(generator, list) and batch is not None:
        images = batch * (per_prompt or 1)
        if len(generator) != images:
            raise CallArgumentError(
                "generator", f"a list of {len(generator)}", f"one generator per image: {images} here"
            )
