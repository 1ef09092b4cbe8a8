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
    return _max_steps(type(scheduler), key, train)


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


def check_steps(scheduler, steps) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise CallArgumentError("num_inference_steps", steps, "a positive integer")
    limit = max_steps(scheduler)
    if limit is not None and steps > limit:
        raise CallArgumentError(
            "num_inference_steps", steps, f"at most {limit} with this {type(scheduler).__name__} "
            f"({scheduler.config.get('num_train_timesteps')} training steps, "
            f"{scheduler.config.get('timestep_spacing', 'its')} spacing)",
        )  # fmt: skip


def check_size(key: str, size, factor: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % factor:
        raise CallArgumentError(key, size, f"a positive multiple of {factor} for this model")
