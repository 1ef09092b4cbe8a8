"""Class-conditional image pipeline (the digits reference model) for any diffusers scheduler.

A saved one loads with ``fastdiff.load_pipeline(dir)`` or ``ClassConditionalPipeline.from_pretrained(dir)``
(diffusers' ``DiffusionPipeline.from_pretrained`` looks class names up on its own module only).

Example::

    from diffusers import DDIMScheduler, UNet2DModel
    from fastdiff.zoo.pipelines import ClassConditionalPipeline

    unet = UNet2DModel(sample_size=16, in_channels=1, out_channels=1, block_out_channels=(32, 64),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), num_class_embeds=11, norm_num_groups=8)
    pipe = ClassConditionalPipeline(unet=unet, scheduler=DDIMScheduler(clip_sample=False))
    images = pipe([0, 1, 2], num_inference_steps=10, guidance_scale=2.0, output_type="np").images
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput, UNet2DModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils.torch_utils import randn_tensor

from fastdiff.core.models import PipelineFacts, register_pipeline

OUTPUT_TYPES = ("pil", "np", "pt")


@register_pipeline(PipelineFacts("class_labels", ("uncond", "cond"), 1.0, 500, num_classes=10))
class ClassConditionalPipeline(DiffusionPipeline):
    """Pixel-space class-conditional sampler with optional classifier-free guidance.

    The UNet's last class embedding (``num_class_embeds - 1``) is the null class used for the
    unconditional branch of classifier-free guidance.
    """

    model_cpu_offload_seq = "unet"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, unet: UNet2DModel, scheduler: SchedulerMixin):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)
        self.image_processor = VaeImageProcessor(do_resize=False, do_normalize=True)

    @property
    def num_classes(self) -> int:
        """Number of real classes (the null class excluded)."""
        return self.unet.config.num_class_embeds - 1

    @property
    def null_class(self) -> int:
        """Label of the unconditional (null) class."""
        return self.unet.config.num_class_embeds - 1

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    def _labels_tensor(self, class_labels) -> torch.Tensor:
        """Validate ``class_labels`` and return them as a long tensor on the execution device."""
        if self.unet.config.num_class_embeds is None:
            raise ValueError("the UNet has no class embedding (num_class_embeds=None); it cannot be class-conditional")
        if isinstance(class_labels, int):
            class_labels = [class_labels]
        labels = torch.as_tensor(class_labels).flatten()
        if labels.numel() == 0:
            raise ValueError("class_labels is empty; pass at least one label")
        if labels.is_floating_point() or labels.is_complex():
            raise ValueError(f"class_labels must be integers, got dtype {labels.dtype}")
        bad = labels[(labels < 0) | (labels >= self.num_classes)]
        if bad.numel():
            raise ValueError(
                f"class label(s) {bad.tolist()} out of range; allowed: 0..{self.num_classes - 1} "
                f"(the null class {self.null_class} is reserved for guidance)"
            )
        return labels.long().to(self._execution_device)

    def _extra_step_kwargs(self, generator) -> dict:
        # Same check as diffusers' prepare_extra_step_kwargs: only stochastic schedulers take a generator.
        accepted = set(inspect.signature(self.scheduler.step).parameters)
        return {"generator": generator} if "generator" in accepted else {}

    @torch.no_grad()
    def __call__(
        self,
        class_labels: list[int] | torch.Tensor,
        num_inference_steps: int = 50,
        guidance_scale: float = 1.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        latents: torch.Tensor | None = None,
        callback_on_step_end: Callable | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ("latents",),
    ) -> ImagePipelineOutput | tuple:
        """Sample one image per label.

        Args:
            class_labels: digit classes (``0..num_classes-1``), one image each.
            num_inference_steps: scheduler steps (> 0).
            guidance_scale: classifier-free guidance scale; ``<= 1`` runs only the conditional branch.
            generator: torch generator(s) for the initial noise and stochastic schedulers.
            output_type: ``"pil"``, ``"np"`` (N,H,W,C in [0,1]) or ``"pt"`` (N,C,H,W in [0,1]).
            return_dict: return an ``ImagePipelineOutput`` (else a 1-tuple).
            latents: optional initial noise, shape (N, C, H, W), before scaling by ``init_noise_sigma``.
            callback_on_step_end: diffusers-style ``fn(pipe, step, timestep, tensors) -> dict``.
            callback_on_step_end_tensor_inputs: tensors passed to the callback (only ``"latents"``).

        Example::

            images = pipe([3, 7], num_inference_steps=20, output_type="np").images  # (2, 16, 16, 1)
        """
        labels = self._labels_tensor(class_labels)
        if not isinstance(num_inference_steps, int) or num_inference_steps <= 0:
            raise ValueError(f"num_inference_steps must be a positive int, got {num_inference_steps!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type {output_type!r} not supported; allowed: {', '.join(OUTPUT_TYPES)}")
        for name in callback_on_step_end_tensor_inputs:
            if name not in self._callback_tensor_inputs:
                raise ValueError(
                    f"callback tensor input {name!r} not allowed; allowed: {self._callback_tensor_inputs}"
                )
        self._guidance_scale = float(guidance_scale)

        device, dtype = self._execution_device, self.unet.dtype
        size = self.unet.config.sample_size
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        shape = (labels.shape[0], self.unet.config.in_channels, height, width)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents have shape {tuple(latents.shape)}, expected {shape}")
        else:
            latents = latents.to(device=device, dtype=dtype)

        self.scheduler.set_timesteps(num_inference_steps, device=device)
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        latents = latents * self.scheduler.init_noise_sigma
        extra_step_kwargs = self._extra_step_kwargs(generator)
        if self.do_classifier_free_guidance:
            # Both branches in one batched denoiser call: [unconditional, conditional].
            model_labels = torch.cat([torch.full_like(labels, self.null_class), labels])
        else:
            model_labels = labels

        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                model_input = torch.cat([latents] * 2) if self.do_classifier_free_guidance else latents
                model_input = self.scheduler.scale_model_input(model_input, t)
                noise_pred = self.unet(model_input, t, class_labels=model_labels).sample
                if self.do_classifier_free_guidance:
                    noise_uncond, noise_cond = noise_pred.chunk(2)
                    noise_pred = noise_uncond + self._guidance_scale * (noise_cond - noise_uncond)
                latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs).prev_sample
                if callback_on_step_end is not None:
                    available = {"latents": latents}  # (locals() inside a comprehension is its own scope)
                    tensors = {name: available[name] for name in callback_on_step_end_tensor_inputs}
                    outputs = callback_on_step_end(self, i, t, tensors) or {}
                    latents = outputs.get("latents", latents)
                progress_bar.update()

        images = self.image_processor.postprocess(latents.float(), output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)


__all__ = ["ClassConditionalPipeline", "OUTPUT_TYPES"]
