"""Samplers: presets over diffusers' schedulers."""

from fastdiff.schedulers.presets import PRESETS, Scheduler, make_scheduler

__all__ = ["PRESETS", "Scheduler", "make_scheduler"]
