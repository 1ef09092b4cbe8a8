"""``lcm-lora(path=DIR)``: a consistency-distilled LoRA (``fastdiff distill consistency --lora``) on the denoiser.

Loads the peft adapter in ``DIR`` into the denoiser (unfused: the base weights are never written), swaps in an
``LCMScheduler`` on the grid the adapter was trained on (``original_inference_steps`` from its
``fastdiff_distill.json``) and defaults ``num_inference_steps`` to ``steps`` (default: the adapter's own
count). When the adapter baked classifier-free guidance in, every call runs only the conditional half of the
batch (one batch per step, whatever ``guidance_scale`` is passed; see ``fastdiff.distill.student``). ``remove()`` puts the original layers, scheduler and defaults back: outputs are bit-identical.

Example::

    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained("/tmp/tiny-ddpm")
    handle = fp.accelerate("lcm-lora(path=/tmp/lcm-lora)")
    images = fp(batch_size=2, output_type="np").images   # 4 LCM steps
    handle.remove()
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastdiff.core.foreign import adapter_layout
from fastdiff.core.hooks import Handle, HandleGroup, all_or_nothing
from fastdiff.core.models import require_prediction
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.distill.student import DistilledAccelerator, baked_guidance, conditional_only
from fastdiff.distill.validate import check_validated

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

ADAPTER_NAME = "fastdiff-lcm"


@register
@dataclass(frozen=True)
class LcmLora(DistilledAccelerator):
    """A consistency LoRA plus the LCM sampler. Example: ``fp.accelerate("lcm-lora(path=/tmp/lcm-lora)")``."""

    spec_name = "lcm-lora"

    def manifest(self) -> dict:
        from fastdiff.distill.common import MANIFEST

        folder = Path(self.path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise AcceleratorError(f"lcm-lora: {self.path!r} is not a peft adapter directory (no adapter_config.json)")
        manifest = folder / MANIFEST
        return json.loads(manifest.read_text()) if manifest.is_file() else {}

    def apply(self, fp: FastPipeline) -> Handle:
        from diffusers import LCMScheduler
        from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
        from peft.tuners.tuners_utils import BaseTunerLayer
        from safetensors.torch import load_file

        from fastdiff.schedulers.presets import explicit_config

        require_prediction(fp, "lcm-lora")  # LCMScheduler's consistency step is a noise-schedule one
        info = self.manifest()
        steps = self.steps or info.get("steps", 4)
        check_validated(self.spec_name, self.path, info, steps, self.unvalidated)
        den, pipe = fp.denoiser, fp.pipe
        if adapter_layout(den):
            raise AcceleratorError("lcm-lora: the denoiser already carries peft adapters; unload them first")
        folder = Path(self.path).expanduser()
        had_config = "peft_config" in den.__dict__
        try:
            inject_adapter_in_model(LoraConfig.from_pretrained(folder), den, adapter_name=ADAPTER_NAME)
            result = set_peft_model_state_dict(
                den, load_file(folder / "adapter_model.safetensors"), adapter_name=ADAPTER_NAME
            )
        except Exception as error:
            _unwrap(den, BaseTunerLayer, had_config)
            raise AcceleratorError(
                f"lcm-lora: the adapter in {self.path} does not fit this denoiser: {error}"
            ) from error
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            _unwrap(den, BaseTunerLayer, had_config)
            raise AcceleratorError(f"lcm-lora: the adapter does not fit this denoiser ({unexpected[:3]} ...)")
        original = pipe.scheduler
        total = original.config.num_train_timesteps
        pipe.scheduler = LCMScheduler.from_config(
            explicit_config(original.config, "LCMScheduler"),
            clip_sample=False,
            original_inference_steps=info.get("original_inference_steps", total // 20),
        )

        def restore():
            pipe.scheduler = original
            _unwrap(den, BaseTunerLayer, had_config)

        with all_or_nothing([Handle(restore)]) as handles:
            try:
                handles.append(fp.set_call_default("num_inference_steps", steps))
                handles.extend(conditional_only(fp, baked_guidance(info)))
            except ValueError as error:  # another accelerator owns that call default
                raise AcceleratorError(f"lcm-lora: {error}") from error
        return HandleGroup(handles)


def _unwrap(module, layer_type, had_config: bool) -> None:
    # Put each wrapped layer's original module (peft keeps it as base_layer) back: the original objects return.
    wrapped = [(name, m) for name, m in module.named_modules() if isinstance(m, layer_type)]
    for name, layer in wrapped:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, layer.get_base_layer())
    if not had_config:
        module.__dict__.pop("peft_config", None)
