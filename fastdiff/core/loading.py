"""Loading a saved pipeline directory: diffusers' own classes, and fastdiff's few own pipeline classes.

Example::

    from fastdiff.core.loading import load_pipeline
    from fastdiff.zoo import build

    pipe = load_pipeline(build("digits", "/tmp/digits"))  # a ClassConditionalPipeline, weights owned
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import torch

# fastdiff's own pipeline classes, by the name model_index.json records, and the module that defines each.
# diffusers resolves "_class_name" on its own module only; these are imported on demand instead of being
# written into the diffusers namespace at `import fastdiff`.
OWN_PIPELINES = {
    "ClassConditionalPipeline": "fastdiff.zoo.pipelines",
    "GMMPipeline": "fastdiff.zoo.gmm",
    "GMMFlowPipeline": "fastdiff.zoo.gmm_flow",
}


def pipeline_class(class_name: str | None):
    """The class that loads a directory whose model_index.json names ``class_name``."""
    from diffusers import DiffusionPipeline

    module = OWN_PIPELINES.get(class_name or "")
    if module is None or class_name is None:
        return DiffusionPipeline
    return getattr(importlib.import_module(module), class_name)


def load_pipeline(path_or_dir: str | os.PathLike, **kwargs):
    """``DiffusionPipeline.from_pretrained`` that also knows fastdiff's pipelines, loads components saved as
    absent (SD3 without its T5) as None, and owns its weights (reloads reproduce the saved pipeline exactly).

    A local path must be a pipeline directory: a missing one raises ``FileNotFoundError``, one without
    ``model_index.json`` ``ValueError``. Anything else goes to diffusers as is (a hub id, offline cache).
    """
    path = Path(path_or_dir).expanduser()
    looks_local = path.is_absolute() or str(path_or_dir).startswith((".", "~")) or path.exists()
    class_name = None
    if looks_local:
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {str(path_or_dir)!r} does not exist")
        if not (path / "model_index.json").is_file():
            raise ValueError(f"{str(path_or_dir)!r} is not a diffusers pipeline directory (no model_index.json)")
        index = json.loads((path / "model_index.json").read_text())
        class_name = index.get("_class_name")
        for name, value in index.items():
            if value == [None, None] and not name.startswith("_"):
                kwargs.setdefault(name, None)
    pipe = pipeline_class(class_name).from_pretrained(str(path), **kwargs)
    own_weights(pipe)
    return pipe


def own_weights(pipe) -> None:
    """Copy every weight out of its memory map."""
    # Memory-mapped safetensors can leave weights misaligned, which changes CPU kernel rounding; copying
    # makes a reloaded pipeline reproduce the saved one bit for bit.
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            for tensor in list(component.parameters()) + list(component.buffers()):
                tensor.data = tensor.data.clone()
