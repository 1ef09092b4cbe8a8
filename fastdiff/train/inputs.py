"""Training inputs taken from a real pipeline: its denoiser's named inputs, noised samples, the training split.

Shared by the pruning recovery (``fastdiff.compress.recover``) and distillation (``fastdiff.distill``).
``capture_inputs`` runs one pipeline call and stops it at the first denoiser call, so the conditioning
(prompt embeddings, class labels, added SDXL embeddings ...) has exactly the layout the denoiser sees.

Example::

    from fastdiff import FastPipeline
    from fastdiff.train.inputs import capture_inputs, noised_inputs
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    inputs = capture_inputs(fp, batch=2)          # sample (4, 4, 16, 16): [uncond, cond]
    noisy, target = noised_inputs(fp.pipe.scheduler.config, inputs)
"""

from __future__ import annotations

import inspect

import torch
from diffusers.hooks import ModelHook


def denoiser_output(module, inputs: dict) -> torch.Tensor:
    # The class forward: training and tracing must not run the wrapper's step-counting hooks.
    return type(module).forward(module, **inputs, return_dict=False)[0]


def sample_key(inputs: dict) -> str:
    """The name of the noisy-sample argument (``sample`` for UNets, ``hidden_states`` for transformers)."""
    return next(k for k in inputs if k in ("sample", "hidden_states"))


class _Captured(Exception):
    def __init__(self, inputs: dict):
        super().__init__("captured")
        self.inputs = inputs


class _CaptureHook(ModelHook):
    """Records the named inputs of the first denoiser call and stops the pipeline there."""

    def new_forward(self, module, *args, **kwargs):
        bound = inspect.signature(type(module).forward).bind(module, *args, **kwargs)
        named = {k: v for k, v in bound.arguments.items() if k not in ("self", "return_dict")}
        named.update(named.pop("kwargs", {}))
        raise _Captured(detach(named))


def detach(value):
    """A detached copy of a tensor, or of every tensor in a dict."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: detach(v) for k, v in value.items()}
    return value


def to_device(value, device):
    """``value`` (a tensor or a dict of them, nested) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def capture_inputs(fp, batch: int = 2, seed: int = 0, guidance: float | None = None) -> dict:
    """The named inputs (sample, timestep, conditioning) of the first denoiser call of a real pipeline call.

    ``guidance`` sets the call's guidance scale (None: the pipeline's default); above 1 a guidance-capable
    pipeline batches both branches, in its ``cfg_layout`` order.
    """
    from fastdiff.core.hooks import install_hook
    from fastdiff.core.inputs import make_inputs

    handle = install_hook(fp.denoiser, _CaptureHook(), "fastdiff.capture")
    bar_config = getattr(fp.pipe, "_progress_bar_config", None)
    fp.pipe.set_progress_bar_config(disable=True)
    try:
        fp(
            **make_inputs(fp.pipe, batch, guidance),
            num_inference_steps=4,
            output_type="np",  # img2img: 4 x strength
            generator=torch.Generator().manual_seed(seed),
        )
    except _Captured as captured:
        inputs = captured.inputs
    else:
        raise RuntimeError(f"{type(fp.pipe).__name__} finished without calling its denoiser")
    finally:
        handle.remove()
        if bar_config is None:
            del fp.pipe._progress_bar_config
        else:
            fp.pipe._progress_bar_config = bar_config
    if "timestep" in inputs and not isinstance(inputs["timestep"], torch.Tensor):  # Z-Image names it t
        inputs["timestep"] = torch.tensor(inputs["timestep"])
    return inputs


def split_branches(inputs: dict, layout: tuple[str, ...]) -> dict[str, dict]:
    """{"cond": inputs, "uncond": inputs} of a guidance batch in ``layout`` order (halves of every batch tensor)."""
    batch = inputs[sample_key(inputs)].shape[0]
    out: dict[str, dict] = {}
    for i, name in enumerate(layout):
        part = slice(i * batch // len(layout), (i + 1) * batch // len(layout))
        out[name] = _take(inputs, part, batch)
    return out


def _take(value, part: slice, batch: int):
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch:
        return value[part]
    if isinstance(value, dict):
        return {k: _take(v, part, batch) for k, v in value.items()}
    return value


def noised_inputs(scheduler_config, inputs: dict, x0=None, labels=None, generator=None):
    """(inputs with ``sample`` = x0 noised at random training timesteps, the training target).

    ``x0`` defaults to random samples of the captured sample's shape (scale 0.5); ``labels`` replace
    ``class_labels``. The target follows the scheduler's ``prediction_type`` (epsilon, v_prediction, sample).
    """
    from diffusers import DDPMScheduler

    noise_schedule = DDPMScheduler.from_config(scheduler_config)
    key = sample_key(inputs)
    shape = inputs[key].shape
    if x0 is None:
        x0 = 0.5 * torch.randn(shape, generator=generator)
    noise = torch.randn(x0.shape, generator=generator)
    t = torch.randint(0, noise_schedule.config.num_train_timesteps, (x0.shape[0],), generator=generator)
    out = dict(inputs, timestep=t)
    out[key] = noise_schedule.add_noise(x0, noise, t)
    if labels is not None:
        out["class_labels"] = labels
    kind = noise_schedule.config.prediction_type
    target = {"epsilon": noise, "sample": x0}.get(kind)
    if target is None:
        target = noise_schedule.get_velocity(x0, noise, t)
    return out, target


def as_fastpipeline(pipe):
    """``pipe`` if it is a FastPipeline, else its existing wrapper, else a new one."""
    from fastdiff.core.pipeline import FastPipeline

    if isinstance(pipe, FastPipeline):
        return pipe
    wrapper = getattr(pipe, "_fastdiff_wrapper", lambda: None)()
    return wrapper if wrapper is not None else FastPipeline(pipe)
