"""The core: wrapper, accelerator registry, hooks, step context, spec parsing and per-model facts."""

from fastdiff.core.context import StepContext
from fastdiff.core.hooks import Handle, HandleGroup, install_hook
from fastdiff.core.loading import load_pipeline
from fastdiff.core.models import UnsupportedModelError, pipeline_facts
from fastdiff.core.pipeline import FastPipeline, NonFiniteOutputError
from fastdiff.core.registry import Accelerator, AcceleratorError, available, register
from fastdiff.core.spec import parse

__all__ = [
    "Accelerator",
    "AcceleratorError",
    "FastPipeline",
    "Handle",
    "HandleGroup",
    "NonFiniteOutputError",
    "StepContext",
    "UnsupportedModelError",
    "available",
    "install_hook",
    "load_pipeline",
    "parse",
    "pipeline_facts",
    "register",
]
