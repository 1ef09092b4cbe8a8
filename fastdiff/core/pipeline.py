"""FastPipeline: a drop-in wrapper over any diffusers pipeline with composable, removable accelerators.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo import build

    fp = FastPipeline.from_pretrained(build("tiny-sd", "/tmp/tiny-sd"))
    handle = fp.accelerate("scheduler(name=dpm++2m,steps=4)")
    image = fp(prompt="a red circle").images[0]
    handle.remove()  # the pipeline is exactly as before
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastdiff.core.calls import (
    StepLimit,
    allowed_steps,
    check_call_values,
    check_ignored_guidance,
    check_size,
    check_steps,
)
from fastdiff.core.context import ContextHook, CountHook, StepContext
from fastdiff.core.foreign import adapter_layout, foreign_forward, refuse_foreign_patches
from fastdiff.core.hooks import (
    Handle,
    HandleGroup,
    install_hook,
    reattach,
    reset_call_state,
    strip_copied_hooks,
)
from fastdiff.core.loading import load_pipeline
from fastdiff.core.models import (
    PIPELINES,
    UnsupportedModelError,
    cfg_enabled,
    find_denoiser,
    separate_cfg,
    spatial_factor,
)
from fastdiff.core.optional import check_needs
from fastdiff.core.registry import (
    Accelerator,
    AcceleratorError,
    apply_order,
    check_conflicts,
    check_device,
)
from fastdiff.core.spec import parse
from fastdiff.core.tensors import pixels

# Declared touches of accelerators that change the denoiser's weights or layers (LoRA changes under them are refused).
WEIGHT_TOUCHES = frozenset({"denoiser.weights", "denoiser.structure"})


class NonFiniteOutputError(FloatingPointError):
    """The pipeline produced NaN or inf; ``.output`` holds the result anyway."""

    def __init__(self, message: str, output: Any):
        super().__init__(message)
        self.output = output


class FastPipeline:
    """Wraps ``pipe``; calling it takes the pipeline's own arguments and returns its own output type."""

    _adapters: Any  # set in __init__ through __dict__ (attribute writes go to the pipeline)

    def __init__(self, pipe, accelerators=None):
        if isinstance(pipe, FastPipeline):
            raise TypeError("pipe is already a FastPipeline; pass fp.pipe to wrap the diffusers pipeline")
        previous = getattr(pipe, "_fastdiff_wrapper", lambda: None)()
        if previous is not None:
            if previous.accelerators:
                raise ValueError(
                    f"this pipeline is already wrapped by {previous!r}; remove its accelerators "
                    "(remove_all()) or keep using that wrapper"
                )
            previous.unwrap()
        denoiser_name, denoiser = find_denoiser(pipe)
        strip_copied_hooks(denoiser)  # a copy of a wrapped model brings hooks nothing will ever activate
        self.__dict__.update(
            pipe=pipe,
            context=StepContext(),
            denoiser_name=denoiser_name,
            _active=[],
            _adapters=None,  # peft adapter layout while a weight-changing accelerator is active
            _defaults={},
            _step_limits=[],
            _trackers=[],
        )
        ctx = self.context
        self._trackers += [
            install_hook(self.denoiser, CountHook(ctx), "fastdiff.count", ctx),
            install_hook(self.denoiser, ContextHook(ctx, lambda: self.pipe), "fastdiff.context", ctx),
        ]
        pipe._fastdiff_wrapper = weakref.ref(self)
        if accelerators:
            self.accelerate(*parse(accelerators))

    @classmethod
    def from_pretrained(cls, path_or_dir: str | os.PathLike, accelerators=None, device=None, **kwargs) -> FastPipeline:
        """Load any diffusers pipeline directory (``fastdiff.core.loading.load_pipeline``) and wrap it.

        ``device`` ("cpu", "cuda", "xla" ...) places the pipeline there before any accelerator is applied.
        """
        pipe = load_pipeline(path_or_dir, **kwargs)
        if device is not None:
            pipe.to(resolve_device(device))
        manifest = Path(path_or_dir).expanduser() / "fastdiff_distill.json"  # a student records its sampler
        if accelerators is None and manifest.is_file():
            accelerators = json.loads(manifest.read_text()).get("load_accelerators") or None
        return cls(pipe, accelerators=accelerators)

    @property
    def denoiser(self) -> torch.nn.Module:
        """The pipeline's UNet or transformer."""
        return getattr(self.pipe, self.denoiser_name)

    # -- accelerators -------------------------------------------------------------------------------------

    @property
    def accelerators(self) -> tuple[Accelerator, ...]:
        """The active accelerator configs, in the order they were applied."""
        return tuple(config for config, _ in self._active)

    def accelerate(self, *accelerators) -> Handle:
        """Apply configs or spec strings; refuse conflicts before changing anything. Returns a removable handle."""
        configs = parse(list(accelerators))
        refuse_foreign_patches(self.pipe, configs)
        fresh: list[Accelerator] = []
        for config in configs:
            if config not in self.accelerators and config not in fresh:
                fresh.append(config)
        check_conflicts(list(self.accelerators), fresh)
        check_device(fresh, self.pipe.device)
        check_needs(fresh)
        applied: list[tuple[Accelerator, Handle]] = []
        try:
            for config in apply_order(fresh):
                applied.append((config, config.apply(self)))
        except (AcceleratorError, UnsupportedModelError) as error:
            for _, handle in reversed(applied):
                handle.remove()
            # Name the pipeline too: the accelerator's own message names itself, the module and why.
            raise type(error)(f"{config} refused on {type(self.pipe).__name__}: {error}") from error
        except BaseException:
            for _, handle in reversed(applied):
                handle.remove()
            raise
        self._active.extend(applied)
        self._mark_adapters()

        def forget():
            self._active[:] = [(c, h) for c, h in self._active if all(h is not a for _, a in applied)]
            self._mark_adapters()

        return HandleGroup([h for _, h in applied], on_remove=forget)

    def remove_all(self) -> None:
        for _, handle in reversed(self._active):
            handle.remove()
        self._active.clear()
        self._adapters = None

    def _weight_changers(self) -> list[Accelerator]:
        return [c for c in self.accelerators if c.touches & WEIGHT_TOUCHES]

    def _mark_adapters(self) -> None:
        self._adapters = adapter_layout(self.denoiser) if self._weight_changers() else None

    def _preflight(self) -> None:
        """Refuse a call that would run active accelerators silently wrong because something changed under them."""
        names = ", ".join(map(str, self.accelerators))
        if foreign_forward(self.denoiser):
            raise AcceleratorError(
                f"{type(self.denoiser).__name__}.forward was replaced after {names} were applied, by another tool "
                "(the DeepCache package does this); disable that tool, or apply it before fastdiff"
            )
        if self._adapters is not None and adapter_layout(self.denoiser) != self._adapters:
            changers = ", ".join(map(str, self._weight_changers()))
            raise AcceleratorError(
                f"LoRA adapters of the {type(self.denoiser).__name__} were loaded, deleted, fused or unfused while "
                f"{changers} (which change its weights) is active; remove it, change the adapters, then apply it again"
            )

    def unwrap(self):
        """Remove every accelerator and the wrapper's own hooks; return the plain diffusers pipeline."""
        self.remove_all()
        for handle in self._trackers:
            handle.remove()
        self.pipe.__dict__.pop("_fastdiff_wrapper", None)
        return self.pipe

    def to(self, *args, **kwargs) -> FastPipeline:
        """``DiffusionPipeline.to`` ("xla" = torch-xla's device); refused if an active accelerator cannot run there."""
        args = tuple(resolve_device(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if kwargs.get("device") is not None:
            kwargs["device"] = resolve_device(kwargs["device"])
        for device in (*args, kwargs.get("device")):
            if isinstance(device, torch.device):
                check_device(list(self.accelerators), device)
        self.pipe.to(*args, **kwargs)
        return self

    def set_call_default(self, key: str, value: Any) -> Handle:
        """Default a call argument (e.g. ``num_inference_steps``) unless the caller passes it."""
        if key in self._defaults:
            raise ValueError(f"call default {key!r} is already set by another accelerator")
        self._defaults[key] = value
        return Handle(lambda: self._defaults.pop(key, None))

    def limit_steps(self, source: str, only=None, maximum: int | None = None) -> Handle:
        """Refuse calls whose ``num_inference_steps`` is not in ``only`` (or is over ``maximum``) while active."""
        limit = StepLimit(source, None if only is None else frozenset(only), maximum)
        self._step_limits.append(limit)
        return Handle(lambda: self._step_limits.remove(limit))

    def allowed_steps(self) -> StepLimit:
        """The step counts a call may ask for now: the scheduler's range and every active accelerator's limit."""
        return allowed_steps(self.pipe.scheduler, self._step_limits)

    # -- calling ------------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        for key, value in self._defaults.items():
            kwargs.setdefault(key, value)
        # Z-Image's pipelines write the chat template into the caller's prompt list: a reused call would change
        kwargs = {k: list(v) if isinstance(v, list) and k.endswith("prompt") else v for k, v in kwargs.items()}
        self._check_call(kwargs)
        reattach(self.denoiser)  # another tool may have swapped the denoiser's forward out and back
        if self._active:
            self._preflight()
        facts = PIPELINES.get(type(self.pipe).__name__)
        self.context.begin_call(
            cfg_enabled(self.pipe, kwargs),
            facts.cfg_layout if facts else (),
            facts.cfg_sequence if facts else (),
            separate_cfg(self.pipe, kwargs),
        )
        reset_call_state(self.denoiser)
        scheduler = self.pipe.scheduler
        sync = step_sync(self.pipe.device)  # XLA: cut the lazy graph at every step boundary
        shadowed = scheduler.__dict__.get("step")
        original_step = scheduler.step
        params = inspect.signature(original_step).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())

        @functools.wraps(original_step)  # diffusers reads step's signature to decide whether to pass generator=
        def counted_step(*a, **k):
            if not takes_any:  # e.g. DDPMPipeline passes generator= even to schedulers without one
                k = {key: v for key, v in k.items() if key in params}
            out = original_step(*a, **k)
            if sync is not None:
                sync()
            self.context.step += 1
            return out

        scheduler.step = counted_step  # instance attribute for this call only; the class method is untouched
        if sync is not None:
            sync()  # runs what is pending (weights an accelerator just changed) apart from the first step's graph
        self.context.active = True
        try:
            output = self.pipe(*args, **kwargs)
        finally:
            self.context.active = False
            if shadowed is None:
                del scheduler.step
            else:
                scheduler.step = shadowed
        if self._active and self.context.step and not self.context.denoiser_calls:
            raise RuntimeError(
                f"the denoiser ran {self.context.step} steps without fastdiff's hooks (another tool replaced "
                f"{type(self.denoiser).__name__}.forward after fastdiff was applied), so "
                f"{', '.join(map(str, self.accelerators))} did not act; apply the other tool first"
            )
        _check_finite(output)
        return output

    def _check_call(self, kwargs: dict) -> None:
        """``CallArgumentError`` (a ValueError) for steps, sizes or values the model, its scheduler or an active
        accelerator cannot take."""
        steps = kwargs.get("num_inference_steps", self._signature_default("num_inference_steps"))
        if steps is not None:
            check_steps(self.pipe.scheduler, steps, self._step_limits)
        check_call_values(kwargs, self._batch_size(kwargs))
        facts = PIPELINES.get(type(self.pipe).__name__)
        if facts is not None and facts.guidance_embeds_flag:
            default = self._signature_default("guidance_scale")
            check_ignored_guidance(kwargs.get("guidance_scale"), default, self.denoiser, facts.guidance_embeds_flag)
        factor = self.size_factor()
        for key in ("height", "width"):
            if kwargs.get(key) is not None:
                check_size(key, kwargs[key], factor)

    def _signature_default(self, name: str):
        return _call_default(type(self.pipe), name)  # type: ignore[arg-type]  # a class hashes by identity

    def _batch_size(self, kwargs: dict) -> int | None:
        for key in ("prompt", "class_labels"):
            value = kwargs.get(key)
            if isinstance(value, (list, tuple)):
                return len(value)
            if isinstance(value, str) or (key == "class_labels" and isinstance(value, int)):
                return 1
        size = kwargs.get("batch_size")  # DDPMPipeline
        return (
            size if isinstance(size, int) and not isinstance(size, bool) else None
        )  # prompt embeddings, tensors: diffusers checks those itself

    def size_factor(self) -> int:
        """Image sizes must be multiples of this: VAE downsampling times the denoiser's own downsampling, and
        what the pipeline's own input checks require (``PipelineFacts.size_multiple`` / ``latent_multiple``)."""
        vae_factor = spatial_factor(self.pipe)
        blocks = getattr(self.denoiser.config, "block_out_channels", None)
        patch = getattr(self.denoiser.config, "patch_size", None) or 1
        if isinstance(patch, (tuple, list)):  # video transformers patch (frames, height, width): Wan
            patch = max(patch[-2:])
        facts = PIPELINES.get(type(self.pipe).__name__)
        latent = math.lcm(2 ** (len(blocks) - 1) if blocks else int(patch), facts.latent_multiple if facts else 1)
        return math.lcm(int(vae_factor * latent), facts.size_multiple if facts else 1)

    # -- pass-through -------------------------------------------------------------------------------------

    def __getattr__(self, name: str):
        return getattr(self.__dict__["pipe"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:
            self.__dict__[name] = value
        else:
            setattr(self.pipe, name, value)

    def __repr__(self) -> str:
        specs = ";".join(map(str, self.accelerators)) or "none"
        return f"FastPipeline({type(self.pipe).__name__}, accelerators={specs})"

    @property
    def call_signature(self) -> inspect.Signature:
        return inspect.signature(self.pipe.__call__)


def resolve_device(device) -> torch.device:
    """``torch.device`` of ``device``; "xla" means torch-xla's current device (needs torch-xla installed)."""
    if str(device).split(":")[0] == "xla":
        from fastdiff.core.device import xla_device

        return xla_device(device)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a torch device; e.g. 'cpu', 'cuda', 'cuda:1', 'xla'") from error


def step_sync(device):
    """What ends a denoising step on ``device``: ``torch_xla.sync`` on XLA devices, else None."""
    if getattr(device, "type", None) != "xla":
        return None
    from fastdiff.core.device import sync

    return sync


@functools.lru_cache(maxsize=256)
def _call_default(cls, name: str):
    """The default of ``cls.__call__``'s argument ``name`` (None if it has none), read once per class."""
    parameter = inspect.signature(cls.__call__).parameters.get(name)
    default = None if parameter is None else parameter.default
    return None if default is inspect.Parameter.empty else default


def _check_finite(output: Any) -> None:
    images = pixels(output)
    if isinstance(images, torch.Tensor):
        finite = bool(torch.isfinite(images).all())
    elif isinstance(images, np.ndarray):
        finite = bool(np.isfinite(images).all())
    else:
        return
    if not finite:
        raise NonFiniteOutputError("the pipeline produced NaN or inf values; the output is on .output", output)
