"""Training data for every trainer: the teacher, its training split, and batches of (x0, conditioning).

One path from a teacher directory to training batches, used by every distiller (progressive, consistency,
LCM-LoRA through consistency, flow progressive, distribution matching) and by the compression recovery:

- ``load_teacher(DIR)``: the teacher as a FastPipeline, refused before any training when it is not a pipeline
  directory or its denoiser or prediction is not one the trainers support;
- ``training_data(DIR)``: the model's training split when its directory ships one (the digits references);
  ``real_latents(fp, DIR)`` the same in the denoiser's latent space; ``prompt_labels(pipe, prompts)`` the label
  each prompt names, for models that register it (``register_prompt_labels``: digits-flow, digits-sd);
- ``teacher_batches(fp, DIR, ...)``: ``Batches`` (x0 from the training split, else noise, with the captured
  conditioning) for noise- and v-prediction teachers, ``FlowBatches`` (the teacher's own samples with their
  prompts' conditioning) for flow-matching ones. ``batch(g)`` returns (x0, cond, uncond) for both.

The denoiser-level pieces they build on (``capture_inputs``, ``noised_inputs``, ``split_branches``) are in
``fastdiff.train.inputs``.

Example::

    import torch
    from fastdiff.train.data import load_teacher, teacher_batches
    from fastdiff.zoo import build

    build("digits", "/tmp/digits-test", size="test")
    fp = load_teacher("/tmp/digits-test")
    x0, cond, uncond = teacher_batches(fp, "/tmp/digits-test", batch=4).batch(torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from fastdiff.core.models import pipeline_facts
from fastdiff.train.inputs import capture_inputs, sample_key, split_branches

SUPPORTED = ("UNet2DModel", "UNet2DConditionModel")


class TrainingInputError(ValueError):
    """Bad training input (teacher, step counts, batch, output directory); nothing was written."""


# pipeline class name -> fn(pipe, prompts) -> the label each prompt names, or None for a model of that class without
PROMPT_LABELS: dict[str, Callable[..., list[int] | None]] = {}


def register_prompt_labels(pipeline_class_name: str):
    """Register, for pipelines of class ``pipeline_class_name``, which training label each prompt names (the
    references register theirs beside their evaluators: the ``fastdiff.quality`` entry points)."""

    def decorator(fn):
        PROMPT_LABELS[pipeline_class_name] = fn
        return fn

    return decorator


def prompt_labels(pipe, prompts: list[str] | None) -> list[int] | None:
    """The training label each of ``prompts`` names, or None where the model registers no such fact."""
    from fastdiff.core.plugins import QUALITY, load_plugins

    load_plugins(QUALITY)  # the references' modules register them
    fn = PROMPT_LABELS.get(type(pipe).__name__)
    return None if fn is None or prompts is None else fn(pipe, list(prompts))


def load_teacher(path, allow_flow: bool = False):
    """FastPipeline of a pipeline directory whose denoiser is a UNet2DModel or UNet2DConditionModel (with
    ``allow_flow``, also any flow-matching model fastdiff has facts for)."""
    from fastdiff.core.denoisers import denoiser_facts
    from fastdiff.core.models import model_prediction
    from fastdiff.core.pipeline import FastPipeline

    path = Path(path)
    if not (path / "model_index.json").is_file():
        raise TrainingInputError(f"teacher {str(path)!r} is not a diffusers pipeline directory (no model_index.json)")
    fp = FastPipeline.from_pretrained(path)
    name = type(fp.denoiser).__name__
    if model_prediction(fp.pipe.scheduler) == "flow":
        if not allow_flow:
            raise TrainingInputError(
                f"teacher {str(path)!r} is a flow-matching model ({name}); this distillation "
                "needs a noise-prediction UNet: use `fastdiff distill progressive`"
            )
        (
            pipeline_facts(fp.pipe),
            denoiser_facts(fp.denoiser, "progressive distillation"),
        )  # refuse unknown models
    elif name not in SUPPORTED:
        raise TrainingInputError(f"teacher {str(path)!r} has a {name}; distillation needs a {' or '.join(SUPPORTED)}")
    elif not hasattr(fp.pipe.scheduler, "alphas_cumprod"):
        raise TrainingInputError(f"teacher's scheduler {type(fp.pipe.scheduler).__name__} has no DDPM noise schedule")
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def training_data(model_dir) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(images in model space, labels) of the model's training split, or None for models without data.

    A digits reference directory keeps its split in ``eval/split.npz`` (images in [0, 1]; the model
    works in [-1, 1]).
    """
    import numpy as np

    path = Path(model_dir) / "eval" / "split.npz"
    if not path.is_file():
        return None
    with np.load(path) as split:
        images = torch.as_tensor(split["x_train"], dtype=torch.float32) * 2 - 1
        return images, torch.as_tensor(split["y_train"], dtype=torch.long)


def real_latents(fp, model_dir, chunk: int = 256) -> torch.Tensor | None:
    """The training split in the denoiser's space, or None without one: through a latent pipeline's VAE (its
    posterior mean, shifted and scaled as the pipeline undoes it), else as ``training_data`` gives it."""
    data = training_data(model_dir)
    vae = getattr(fp.pipe, "vae", None)
    if data is None or vae is None:
        return None if data is None else data[0]
    with torch.no_grad():
        means = [vae.encode(part).latent_dist.mean for part in data[0].split(chunk)]
    shift = vae.config.get("shift_factor") or 0.0
    return (torch.cat(means) - shift) * vae.config.scaling_factor


def conditioning(fp, count: int, seed: int) -> tuple[str, tuple, dict, dict | None]:
    """(noisy-sample argument, sample shape, cond, uncond) of ``count`` images of one captured denoiser call:
    the denoiser's other inputs per guidance branch (``uncond`` None for pipelines without guidance)."""
    layout = pipeline_facts(fp.pipe).cfg_layout
    captured = capture_inputs(fp, batch=count, seed=seed, guidance=2.0 if layout else None)
    key = sample_key(captured)  # the denoiser's noisy-sample argument
    shape = tuple(captured[key].shape[1:])
    if layout and captured[key].shape[0] == 2 * count:
        branches = split_branches(captured, layout)
        cond, uncond = branches["cond"], branches["uncond"]
    else:
        cond, uncond = captured, None
    for part in (cond, uncond or {}):
        part.pop(key, None)
        part.pop("timestep", None)
    return key, shape, cond, uncond


class Batches:
    """Training batches: x0 (the training split when the model has one, else 0.5 * noise) and conditioning.

    ``batch(g)`` returns (x0, cond, uncond): ``cond``/``uncond`` are the denoiser's other inputs for the
    guided and the unguided branch (``uncond`` is None for pipelines without classifier-free guidance).
    """

    def __init__(self, fp, model_dir, batch: int, seed: int = 0):
        self.size = batch
        self.key, self.shape, self.cond, self.uncond = conditioning(fp, batch, seed)
        data = training_data(model_dir) if model_dir is not None else None
        self.x0, self.labels = data if data is not None else (None, None)
        self.null_class = None
        if self.labels is not None and self.uncond is not None:
            self.null_class = fp.denoiser.config.num_class_embeds - 1

    def batch(self, g: torch.Generator):
        if self.x0 is None:
            return 0.5 * torch.randn((self.size, *self.shape), generator=g), self.cond, self.uncond
        idx = torch.randint(0, self.x0.shape[0], (self.size,), generator=g)
        cond, uncond = dict(self.cond), self.uncond and dict(self.uncond)
        if self.labels is not None:
            cond["class_labels"] = self.labels[idx]
            if uncond is not None:
                uncond["class_labels"] = torch.full_like(self.labels[idx], self.null_class)
        return self.x0[idx], cond, uncond


class FlowBatches:
    """Training batches of teacher samples with their own prompts' conditioning.

    ``batch(g)`` returns (x0, cond, uncond) like ``Batches``: x0 in the denoiser's latent
    space, ``cond``/``uncond`` the denoiser's other inputs per branch (``uncond`` None without guidance).
    ``prompts``: the pool's prompts, one per row of ``cond`` (None for a model without prompts).
    """

    def __init__(self, fp, batch: int, pool: int, guidance: float, steps: int, seed: int = 0):
        from fastdiff.core.inputs import make_inputs
        from fastdiff.core.tensors import pixels

        self.size = batch
        self.key, _, self.cond, self.uncond = conditioning(fp, pool, seed)
        kwargs = make_inputs(fp.pipe, pool, guidance if pipeline_facts(fp.pipe).cfg_layout else None)
        self.prompts = kwargs.get("prompt")
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.x0 = pixels(fp(**kwargs, num_inference_steps=steps, output_type="latent", generator=generator))
        if self.x0.shape[0] != pool or not torch.isfinite(self.x0).all():
            raise TrainingInputError(f"the teacher's {pool} samples came back as {tuple(self.x0.shape)} or non-finite")
        self.shape = tuple(self.x0.shape[1:])

    def batch(self, g: torch.Generator):
        idx = torch.randint(0, self.x0.shape[0], (self.size,), generator=g)
        pool = self.x0.shape[0]
        uncond = None if self.uncond is None else take_rows(self.uncond, idx, pool)
        return self.x0[idx], take_rows(self.cond, idx, pool), uncond


def take_rows(value, idx, pool: int):
    """Rows ``idx`` of every tensor in ``value`` (a dict of inputs) whose first dimension is the pool's ``pool``."""
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == pool:
        return value[idx]
    if isinstance(value, dict):
        return {k: take_rows(v, idx, pool) for k, v in value.items()}
    return value


def teacher_batches(
    fp, teacher_dir, batch: int, seed: int = 0, guidance: float = 1.0, pool: int = 64, steps: int = 2
) -> Batches | FlowBatches:
    """The training batches of ``fp``'s teacher: ``FlowBatches`` of ``pool`` teacher samples (``steps`` flow
    steps at ``guidance``) for a flow-matching teacher, else ``Batches`` from its training split or noise."""
    from fastdiff.core.models import model_prediction

    if model_prediction(fp.pipe.scheduler) == "flow":
        return FlowBatches(fp, batch, pool, guidance, steps, seed)
    return Batches(fp, teacher_dir, batch, seed)
