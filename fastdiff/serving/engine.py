"""The pipeline side of the server: named acceleration profiles switched between batches, per-image seeds.

A profile is a fixed set of accelerator specs given at start (``{"fast": "scheduler(name=dpm++2m,steps=10)"}``);
``Engine.use(name)`` removes the active profile's handle and applies the other's (``fp.accelerate(specs)``),
and does nothing when that profile is already active. Every image gets its own ``torch.Generator`` seeded
with its seed: its initial latents are drawn from it alone (passed as ``latents=``) and the same generators go
to stochastic samplers, so an image does not depend on which seeds it is batched with. Batched matmuls and
convolutions still round differently with a different batch size, so batched with other requests an image may
differ from the same request run alone by 1/255 in a few pixel values (docs/serving.md, "Reproducible by
seed"). With ``exact_seeds=True`` every request runs in a pipeline call of its own (its ``count`` images
together, nothing else), so its PNGs are bit-identical whatever else is queued.

Example::

    from fastdiff.serving.engine import Engine
    from fastdiff.zoo.shipped import install_digits

    engine = Engine.load(install_digits("/tmp/digits"), {"fast": "scheduler(name=dpm++2m,steps=10)"})
    request = engine.request_model()(label=3, seed=7)
    [result] = engine.generate_one(request)  # {"pngs": [b"\\x89PNG..."], "seeds": [7], ...}
"""

from __future__ import annotations

import io
import itertools
import time
from pathlib import Path
from typing import Any

import torch

from fastdiff.core.calls import StepLimit
from fastdiff.core.inputs import model_eval_settings
from fastdiff.core.models import pipeline_facts
from fastdiff.core.pipeline import FastPipeline
from fastdiff.core.spec import parse
from fastdiff.serving.schemas import Limits, ModelFacts, request_model


class Dropped(Exception):
    """Every request of a running batch gave up (timed out): its work stops between steps."""


class Engine:
    """A FastPipeline, its profiles and the one that is active. Not thread-safe: one batch at a time."""

    def __init__(
        self,
        fp: FastPipeline,
        profiles: dict[str, str],
        limits: Limits | None = None,
        exact_seeds: bool = False,
    ):
        if not profiles:
            profiles = {"default": ""}
        self.fp, self.limits = fp, limits or Limits()
        self.exact_seeds = exact_seeds  # one pipeline call per request: images independent of the queue
        self._tokens = itertools.count()  # with exact_seeds, makes every batch key unique
        fp.pipe.set_progress_bar_config(disable=True)
        facts = pipeline_facts(fp.pipe)
        if facts.inputs not in ("prompt", "class_labels"):
            raise ValueError(
                f"{type(fp.pipe).__name__} takes neither prompts nor class labels; the server serves text "
                "models (prompt) and class-conditional models (label)"
            )
        self.kind = "prompt" if facts.inputs == "prompt" else "label"
        # the model's own bench guidance where its directory records one (digits-flow), else the pipeline's
        self.default_guidance = model_eval_settings(fp.pipe).get("guidance", facts.default_guidance)
        self.profiles: dict[str, str] = {}
        self.step_limits: dict[str, StepLimit] = {}  # what the library allows under each profile
        for name, specs in profiles.items():
            if not name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"profile name {name!r} must be letters, digits, '-' or '_'")
            configs = parse(specs)  # a bad spec stops the server at start, with the parser's message
            handle = fp.accelerate(*configs)  # and so does one this model refuses
            self.step_limits[name] = fp.allowed_steps()
            handle.remove()
            self.profiles[name] = ";".join(map(str, configs))
        self.active: str | None = None
        self._handle = None
        self.switches = 0

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        profiles: dict[str, str],
        limits: Limits | None = None,
        exact_seeds: bool = False,
    ) -> Engine:
        return cls(FastPipeline.from_pretrained(model_dir), profiles, limits, exact_seeds)

    # -- what the model takes -------------------------------------------------------------------------------

    def facts(self) -> ModelFacts:
        denoiser = self.fp.denoiser
        sample = denoiser.config.sample_size
        sample = sample if isinstance(sample, int) else sample[0]
        scale = getattr(self.fp.pipe, "vae_scale_factor", None)
        if scale is None:  # pixel-space model: one size
            return ModelFacts(self.kind, self.num_classes, 1, sample, sample)
        return ModelFacts(self.kind, self.num_classes, self.fp.size_factor(), None, sample * scale)

    @property
    def num_classes(self) -> int:
        return getattr(self.fp.pipe, "num_classes", 0) if self.kind == "label" else 0

    def request_model(self):
        return request_model(self.facts(), self.limits, tuple(self.profiles), self.step_limits)

    def batch_key(self, request) -> tuple:
        """Requests with equal keys can share one pipeline call. With ``exact_seeds`` each call returns a new
        key (a running number is appended): no two requests are ever batched together."""
        key = self.call_settings(request)
        return (*key, next(self._tokens)) if self.exact_seeds else key

    def call_settings(self, request) -> tuple:
        """``(profile, width, height, steps, guidance)``: what one pipeline call needs all its requests to share."""
        side = self.facts().default_size
        width = getattr(request, "width", None) or side
        height = getattr(request, "height", None) or side
        guidance = self.default_guidance if request.guidance is None else request.guidance
        return (request.profile, width, height, request.steps, guidance)

    # -- profiles -------------------------------------------------------------------------------------------

    def use(self, name: str) -> bool:
        """Make profile ``name`` the active one; returns whether anything changed."""
        if name not in self.profiles:
            raise ValueError(f"unknown profile {name!r}; allowed: {', '.join(self.profiles)}")
        if name == self.active:
            return False
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.active = None
        if self.profiles[name]:
            self._handle = self.fp.accelerate(self.profiles[name])
        self.active = name
        self.switches += 1
        return True

    # -- generation -----------------------------------------------------------------------------------------

    def generate(self, requests: list, seeds: list[list[int]], should_stop=lambda: False) -> list[dict[str, Any]]:
        """One pipeline call for ``requests`` (equal ``call_settings``); ``seeds[i]`` has one seed per image.

        With ``exact_seeds``, one call per request instead, one after another (the server never hands it more
        than one; a direct caller may)."""
        if self.exact_seeds and len(requests) > 1:
            return [
                result
                for request, request_seeds in zip(requests, seeds, strict=True)
                for result in self._generate([request], [request_seeds], should_stop)
            ]
        return self._generate(requests, seeds, should_stop)

    def _generate(self, requests: list, seeds: list[list[int]], should_stop) -> list[dict[str, Any]]:
        profile, width, height, steps, guidance = self.call_settings(requests[0])
        switch_started = time.perf_counter()
        switched = self.use(profile)
        switch_s = time.perf_counter() - switch_started
        flat = [(request, seed) for request, request_seeds in zip(requests, seeds) for seed in request_seeds]
        generators = [torch.Generator().manual_seed(seed) for _, seed in flat]
        call: dict[str, Any] = {"output_type": "np", "guidance_scale": guidance, "generator": generators}
        call["latents"] = torch.cat([self._noise(g, width, height) for g in generators])
        if steps is not None:
            call["num_inference_steps"] = steps
        if self.kind == "prompt":
            call["prompt"] = [request.prompt for request, _ in flat]
            call["negative_prompt"] = [request.negative_prompt or "" for request, _ in flat]
            call["width"], call["height"] = width, height
        else:
            call["class_labels"] = [request.label for request, _ in flat]
        last_step = [time.perf_counter()]

        def on_step(pipe, i, t, tensors):
            if should_stop():
                raise Dropped("every request of this batch timed out")
            last_step[0] = time.perf_counter()
            return {}

        call["callback_on_step_end"] = on_step
        call["callback_on_step_end_tensor_inputs"] = []  # timing only (and ClassConditionalPipeline's locals()
        # lookup of tensors inside a comprehension fails on Python 3.11+: no tensors are asked for)
        started = time.perf_counter()
        images = self.fp(**call).images
        ended = time.perf_counter()
        pngs = [_png(image) for image in self.fp.pipe.image_processor.numpy_to_pil(images)]
        timings = {"denoise_s": last_step[0] - started, "decode_s": time.perf_counter() - last_step[0]}
        results, start = [], 0
        for request_seeds in seeds:
            n = len(request_seeds)
            results.append(
                dict(
                    pngs=pngs[start : start + n],
                    seeds=request_seeds,
                    profile=profile,
                    spec=self.profiles[profile],
                    batch_size=len(flat),
                    switched=switched,
                    switch_s=switch_s,
                    call_s=ended - started,
                    **timings,
                )
            )
            start += n
        return results

    def generate_one(self, request, seed: int | None = None) -> list[dict[str, Any]]:
        """Generate one request alone (tests, scripts): seeds from ``request.seed`` (or ``seed``) upwards."""
        base = request.seed if request.seed is not None else (seed or 0)
        return self.generate([request], [[base + i for i in range(request.count)]])

    def _noise(self, generator: torch.Generator, width: int, height: int) -> torch.Tensor:
        denoiser = self.fp.denoiser
        scale = getattr(self.fp.pipe, "vae_scale_factor", 1) or 1
        shape = (1, denoiser.config.in_channels, height // scale, width // scale)
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(denoiser.dtype)


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
