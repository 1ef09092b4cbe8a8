"""Classifier guidance: steer sampling toward a class with a noise-aware classifier's gradient.

Dhariwal & Nichol 2021 ("Diffusion models beat GANs on image synthesis") add the gradient of a classifier
p(y | x_t, t), trained on noisy samples, to the score. For an epsilon-predicting denoiser

    eps_hat = eps - s * sqrt(1 - abar_t) * grad_x log p(y | x_t)

and, with x_t held fixed, the same change of the score is ``/ sqrt(abar_t)`` that for v prediction and
``-sqrt(1 - abar_t) / sqrt(abar_t)`` times it for x0 ("sample") prediction. A ``new_forward`` hook on the
denoiser runs the denoiser, then the classifier (forward and backward) on the detached input, and changes
the prediction. Every sampler preset sees the guided prediction; ``abar_t`` comes from the scheduler's
schedule at ``fp.context.timestep`` (fractional Karras timesteps are interpolated in log sigma, as diffusers
maps sigmas to timesteps). With classifier-free guidance the gradient is taken once, on the conditional
chunk, and added to every branch, which adds it once to the guided combination.

Options: ``path`` (a file from ``fastdiff train-classifier``), ``scale`` (0 = off, bit for bit), ``label``
(one class for every image; default: each image's own class label), ``start``/``end`` (guide only while
``start <= progress < end``; outside, no classifier cost), ``unconditional`` (the denoiser runs on its null
class, i.e. as the unconditional model, and the classifier supplies the class; needs a pipeline with a
``null_class``, such as the digits reference).

Example::

    from fastdiff import FastPipeline
    from fastdiff.cli.classifier_guidance import main
    from fastdiff.zoo.shipped import install_digits

    install_digits("/tmp/digits")
    main(["train-classifier", "/tmp/digits", "/tmp/digits/noisy_classifier.pt"])  # once: ~4 min on one core
    fp = FastPipeline.from_pretrained("/tmp/digits")
    fp.accelerate("classifier-guidance(path=/tmp/digits/noisy_classifier.pt,scale=4,unconditional=true)")
    images = fp([3, 7], num_inference_steps=20, output_type="np").images   # a 3 and a 7, unconditional model
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import Handle, install_hook
from fastdiff.core.models import require_prediction
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.guidance.noisy_classifier import (
    NoisyClassifierError,
    alphas_cumprod,
    load_noisy_classifier,
    same_schedule,
    schedule_of,
)

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK_NAME = "fastdiff.classifier-guidance"
PREDICTIONS = ("epsilon", "v_prediction", "sample")


class NoiseSchedule:
    """abar_t at any (fractional) timestep and the prediction type, from a scheduler config."""

    def __init__(self, config):
        self.key = schedule_key(config)
        self.prediction_type = config.get("prediction_type", "epsilon")
        alphas = alphas_cumprod(config).double().numpy()
        self.log_sigmas = np.log(np.sqrt((1 - alphas) / alphas))

    def alpha_bar(self, timestep: float) -> float:
        # Linear in log sigma between integer timesteps: the inverse of diffusers' _sigma_to_t.
        t = min(max(float(timestep), 0.0), len(self.log_sigmas) - 1.0)
        log_sigma = np.interp(t, np.arange(len(self.log_sigmas)), self.log_sigmas)
        return float(1.0 / (1.0 + math.exp(2 * log_sigma)))


def schedule_key(config) -> tuple:
    return (
        config.get("prediction_type", "epsilon"),
        *sorted((k, str(v)) for k, v in schedule_of(config).items()),
    )


def prediction_shift(grad: torch.Tensor, scale: float, alpha_bar: float, prediction_type: str) -> torch.Tensor:
    """Change of the denoiser's prediction that adds ``scale * grad`` (grad of log p(y|x_t)) to the score."""
    sigma, root = math.sqrt(1.0 - alpha_bar), math.sqrt(alpha_bar)
    eps_shift = -scale * sigma * grad
    if prediction_type == "epsilon":
        return eps_shift
    if prediction_type == "v_prediction":
        return eps_shift / root
    if prediction_type == "sample":
        return -sigma / root * eps_shift
    raise AcceleratorError(
        f"classifier-guidance: prediction type {prediction_type!r} not supported; allowed: {', '.join(PREDICTIONS)}"
    )


def _first_tensor(output):
    """(prediction tensor, function that rebuilds the output around a new one) for tensor/tuple/dataclass."""
    if isinstance(output, torch.Tensor):
        return output, lambda new: new
    if isinstance(output, tuple):
        return output[0], lambda new: (new, *output[1:])
    if dataclasses.is_dataclass(output) and isinstance(output, dict):  # diffusers BaseOutput
        key = next(iter(output.keys()))
        return output[key], lambda new: dataclasses.replace(output, **{key: new})
    raise AcceleratorError(f"classifier-guidance: cannot read a prediction from {type(output).__name__}")


def _get_arg(args, kwargs, index: int, names: tuple[str, ...]):
    if len(args) > index:
        return args[index]
    return next((kwargs[n] for n in names if n in kwargs), None)


class ClassifierGuidanceHook(ModelHook):
    """Runs the denoiser, then adds the scaled classifier gradient to its prediction inside the window."""

    def __init__(self, context, config: ClassifierGuidance, classifier, pipe_ref, null_class: int | None):
        super().__init__()
        self.context, self.config, self.classifier = context, config, classifier
        self.pipe_ref, self.null_class, self.schedule = pipe_ref, null_class, None

    def _noise_schedule(self) -> NoiseSchedule:
        config = self.pipe_ref().scheduler.config  # read per call: the scheduler may have been swapped
        if self.schedule is None or self.schedule.key != schedule_key(config):
            self.schedule = NoiseSchedule(config)
        return self.schedule

    def new_forward(self, module, *args, **kwargs):
        config, ctx = self.config, self.context
        labels = _get_arg(args, kwargs, 2, ("class_labels",))
        if config.unconditional and isinstance(labels, torch.Tensor):  # the denoiser runs unconditionally
            null = torch.full_like(labels, self.null_class)
            if len(args) > 2:
                args = (*args[:2], null, *args[3:])
            else:
                kwargs = {**kwargs, "class_labels": null}
        output = self.fn_ref.original_forward(*args, **kwargs)
        if config.scale == 0 or not config.start <= ctx.progress < config.end:
            return output
        sample = _get_arg(args, kwargs, 0, ("sample", "hidden_states"))
        batch, branches = sample.shape[0], ctx.branches
        chunks = len(branches) if len(branches) > 1 and "cond" in branches and batch % len(branches) == 0 else 1
        size = batch // chunks
        lo = branches.index("cond") * size if chunks > 1 else 0
        x = sample[lo : lo + size]
        y = self._labels(labels, lo, size, batch, x.device)
        grad = self.gradient(x, y, ctx.timestep)
        schedule = self._noise_schedule()
        shift = prediction_shift(grad, config.scale, schedule.alpha_bar(ctx.timestep), schedule.prediction_type)
        prediction, rebuild = _first_tensor(output)
        shift = torch.cat([shift] * chunks).to(prediction.dtype)
        channels = sample.shape[1]  # learned-variance models (DiT) output [prediction, variance]
        if prediction.shape[1] == channels:
            return rebuild(prediction + shift)
        return rebuild(torch.cat([prediction[:, :channels] + shift, prediction[:, channels:]], dim=1))

    def _labels(self, labels, lo: int, size: int, batch: int, device) -> torch.Tensor:
        classes = self.classifier.config["num_classes"]
        if self.config.label is not None:
            return torch.full((size,), self.config.label, dtype=torch.long, device=device)
        if not isinstance(labels, torch.Tensor) or labels.numel() != batch:
            raise AcceleratorError(
                "classifier-guidance: this denoiser call has no per-image class labels; give label=N"
            )
        y = labels.reshape(-1)[lo : lo + size].long().to(device)
        if y.min() < 0 or y.max() >= classes:
            raise AcceleratorError(
                f"classifier-guidance: class labels {sorted(set(y.tolist()))} are outside the classifier's "
                f"0..{classes - 1}; give label=N"
            )
        return y

    def gradient(self, x: torch.Tensor, y: torch.Tensor, timestep: float | None) -> torch.Tensor:
        """grad_x log p(y | x, t), in float32, with autograd on inside the pipeline's no_grad."""
        if timestep is None:
            raise AcceleratorError("classifier-guidance: the denoiser call carries no timestep")
        classifier = self.classifier
        if next(classifier.parameters()).device != x.device:
            classifier.to(x.device)
        with torch.inference_mode(False), torch.enable_grad():
            x = x.detach().float().clone().requires_grad_(True)
            logits = classifier(x, torch.full((x.shape[0],), float(timestep), device=x.device))
            log_p = torch.log_softmax(logits, dim=1).gather(1, y[:, None]).sum()
            (grad,) = torch.autograd.grad(log_p, x)
        return grad


@register
@dataclasses.dataclass(frozen=True)
class ClassifierGuidance(Accelerator):
    """Add ``scale`` times a noise-aware classifier's gradient of log p(label | x_t) to every prediction.

    Example: ``fp.accelerate("classifier-guidance(path=clf.pt,scale=4,unconditional=true,end=0.8)")``.
    """

    path: str
    scale: float = option(1.0, ge=0)
    label: int | None = option(None, ge=0)
    start: float = option(0.0, ge=0, le=1)
    end: float = option(1.0, ge=0, le=1)
    unconditional: bool = False

    spec_name = "classifier-guidance"
    kind = "guidance"
    touches = frozenset({"denoiser.forward"})
    conflicts_with = frozenset({"classifier-guidance"})  # one classifier per pipeline

    def validate(self) -> None:
        name = self.spec_name
        if not isinstance(self.path, str) or not self.path.strip():
            raise AcceleratorError(f"{name}: path must name a classifier file, got {self.path!r}")
        if self.start > self.end:
            raise AcceleratorError(f"{name}: start ({self.start}) must be <= end ({self.end})")

    def apply(self, fp: FastPipeline) -> Handle:
        name = self.spec_name
        require_prediction(fp, name, PREDICTIONS)  # the gradient's shift is derived for noise-schedule models
        try:
            classifier, report = load_noisy_classifier(self.path)
        except NoisyClassifierError as exc:
            raise AcceleratorError(f"{name}: {exc}") from exc
        classes = classifier.config["num_classes"]
        if self.label is not None and self.label >= classes:
            raise AcceleratorError(
                f"{name}: label {self.label} is not a class of the classifier at {self.path} (0..{classes - 1})"
            )
        denoiser_channels = getattr(fp.denoiser.config, "in_channels", None)
        if denoiser_channels != classifier.config["in_channels"]:
            raise AcceleratorError(
                f"{name}: the classifier takes {classifier.config['in_channels']} channels, the "
                f"{type(fp.denoiser).__name__} {denoiser_channels}; train one on this model's data"
            )
        trained, current = report.get("schedule"), fp.pipe.scheduler.config
        if trained is not None and not same_schedule(trained, current):
            raise AcceleratorError(
                f"{name}: the classifier was trained for noise schedule {trained}, the pipeline uses "
                f"{schedule_of(current)}; train one for this model"
            )
        null_class = getattr(fp.pipe, "null_class", None)
        if self.unconditional and null_class is None:
            raise AcceleratorError(
                f"{name}: unconditional=true needs a class-conditional pipeline with a null class "
                f"(e.g. ClassConditionalPipeline); {type(fp.pipe).__name__} has none"
            )
        takes_labels = "class_labels" in inspect.signature(type(fp.pipe).__call__).parameters
        if self.label is None and not takes_labels:
            raise AcceleratorError(f"{name}: {type(fp.pipe).__name__} takes no class labels; give label=N")
        hook = ClassifierGuidanceHook(fp.context, self, classifier, weakref.ref(fp.pipe), null_class)
        return install_hook(fp.denoiser, hook, HOOK_NAME, fp.context)
