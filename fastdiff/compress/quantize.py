"""Weight quantization of the denoiser's Linear layers with torchao; removable (the fp weights are kept).

Modes (torchao ``quantize_`` configs, per-row/per-channel symmetric scales):

- ``int8-dynamic``: ``Int8DynamicActivationInt8WeightConfig``: int8 weights, activations quantized per token at
  run time, int8 x int8 matmul (``torch._int_mm``). Fast mostly under ``compile``: in eager mode on CPU the
  activation quantization is separate kernels that can cost more than the matmul saves.
- ``int8-weight``: ``Int8WeightOnlyConfig``: int8 weights dequantized in the matmul; saves memory.
- ``fp8``: ``Float8DynamicActivationFloat8WeightConfig``; needs a CUDA GPU of compute capability >= 8.9 and is
  refused elsewhere.
- ``int8-static``: convolutions AND linears, static int8 activations, through torchao's PT2E flow
  (``torch.export`` + ``X86InductorQuantizer`` + ``torch.compile``), calibrated on one pipeline call of
  ``calibration_batch`` inputs and ``calibration_steps`` steps; x86 CPUs only, float32. It compiles (minutes at
  the first call of each batch size) and needs no ``compile`` on top. See ``quantize_static.py``. On the digits
  reference (500 images, dpm++2m 20, 1 thread, AVX512-VNNI): 1.90x CPU time vs fp32 (fp32 ``compile``: 1.26x),
  accuracy 98.4% (unchanged), FD 4.14 (fp32 4.19).

Except in ``int8-static``, only ``nn.Linear`` layers are quantized: torchao's int8 tensors implement linear, not
convolution, so the UNets' convolutions stay in floating point (for SD-style UNets most of the compute). ``remove()`` puts every original
weight Parameter back (bit-identical outputs); while active the fp weights are kept in memory for that.

Saving: torchao tensors do not go through safetensors (``save_pretrained()`` raises "Attempted to access the
data pointer on an invalid python storage"). ``save_pretrained(dir, safe_serialization=False)`` works and
``from_pretrained(dir)`` loads the int8 weights back (a plain model with quantized weights, no accelerator
active); ``save_quantized`` / ``load_quantized`` below do the same for the denoiser's state dict alone.

Example::

    from fastdiff import FastPipeline
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    handle = fp.accelerate("quantize(mode=int8-dynamic)")
    image = fp(prompt="a red fox", num_inference_steps=2).images[0]
    handle.remove()  # the fp32 weights are back
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import Handle
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

MODES = ("int8-dynamic", "int8-weight", "fp8", "int8-static")


def torchao_config(mode: str):
    """The torchao config for ``mode``; no global inductor settings are changed (set_inductor_config=False)."""
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    if mode == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    if mode == "int8-weight":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if mode == "fp8":
        return Float8DynamicActivationFloat8WeightConfig(set_inductor_config=False)
    raise AcceleratorError(f"quantize: unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def _check_fp8_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise AcceleratorError(
            f"quantize(mode=fp8) needs a CUDA GPU with compute capability >= 8.9 (float8 matmul); the denoiser "
            f"is on {device.type}. Use mode=int8-dynamic or mode=int8-weight there"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise AcceleratorError(
            f"quantize(mode=fp8) needs compute capability >= 8.9, this GPU has {capability[0]}.{capability[1]}; "
            "use mode=int8-dynamic or mode=int8-weight"
        )


def quantizable_linears(denoiser: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """(name, layer) of every floating-point ``nn.Linear`` in the denoiser."""
    return [
        (name, m)
        for name, m in denoiser.named_modules()
        if isinstance(m, torch.nn.Linear) and type(m.weight) is torch.nn.Parameter and m.weight.is_floating_point()
    ]


@register
@dataclass(frozen=True)
class Quantize(Accelerator):
    """Quantize the denoiser's Linear weights with torchao. Example: ``fp.accelerate("quantize(mode=int8-dynamic)")``.

    Pair with ``compile`` for speed on CPU (``"quantize;compile"``): torchao's int8 paths are built to be fused.
    """

    mode: Literal["int8-dynamic", "int8-weight", "fp8", "int8-static"] = "int8-dynamic"
    calibration_batch: int = option(16, ge=1)  # int8-static only
    calibration_steps: int = option(20, ge=1)  # int8-static only

    spec_name = "quantize"
    needs = ("torchao",)
    kind = "compress"
    touches = frozenset({"denoiser.weights"})
    exclusive = frozenset({"denoiser.weights"})

    def validate(self) -> None:
        if self.mode != "int8-static" and (self.calibration_batch, self.calibration_steps) != (16, 20):
            raise AcceleratorError("quantize: calibration_batch/calibration_steps apply to mode=int8-static only")

    def apply(self, fp: FastPipeline) -> Handle:
        from torchao.quantization import quantize_

        denoiser = fp.denoiser
        denoiser_facts(denoiser, "quantize")
        if self.mode == "int8-static":
            from fastdiff.compress.quantize_static import apply_static

            group, blocks = apply_static(fp, self.calibration_batch, self.calibration_steps)
            group.info.update(blocks=blocks)
            return group
        layers = quantizable_linears(denoiser)
        if not layers:
            raise AcceleratorError(f"quantize: {type(denoiser).__name__} has no floating-point Linear layer")
        if self.mode == "fp8":
            _check_fp8_device(layers[0][1].weight.device)
        # What restores them: the original Parameter objects, and whether extra_repr was an instance attribute.
        saved = [(m, m.weight, "extra_repr" in m.__dict__) for _, m in layers]
        chosen = {id(m) for _, m in layers}

        def restore():
            for module, weight, had_repr in saved:
                module.weight = weight
                if not had_repr:
                    module.__dict__.pop("extra_repr", None)  # torchao sets one per quantized layer

        try:
            with torch.no_grad():
                quantize_(denoiser, torchao_config(self.mode), filter_fn=lambda m, _: id(m) in chosen)
        except BaseException:
            restore()
            raise
        return Handle(restore, layers=len(layers), quantized_params=sum(w.numel() for _, w, _ in saved))


def save_quantized(fp, path: str | Path) -> Path:
    """Save the denoiser's state dict (torchao tensors included) with ``torch.save``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fp.denoiser.state_dict(), path)
    return path


def load_quantized(fp, path: str | Path) -> None:
    """Load a ``save_quantized`` file into ``fp``'s denoiser, replacing its weights by the saved (int8) ones.

    The denoiser must have the same architecture; afterwards it holds quantized weights with no accelerator
    active (reload the model to get the fp weights back).
    """
    state = torch.load(Path(path), weights_only=True)
    fp.denoiser.load_state_dict(state, assign=True)
