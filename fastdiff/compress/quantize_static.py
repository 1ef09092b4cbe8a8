"""Static int8 quantization of convolutions and linears (``quantize(mode=int8-static)``), CPU only.

torchao's PT2E flow per block: ``torch.export`` of each compile unit (the largest hook-free submodules with
weights: time embedding, down/mid/up blocks; see ``runtime.compile_units``), ``prepare_pt2e`` with the
``X86InductorQuantizer`` (int8 activations per tensor, int8 weights per output channel, both static),
calibration on the inputs the units receive during a real pipeline call, ``convert_pt2e``, then
``torch.compile`` (inductor, with freezing) which lowers the quantized patterns to oneDNN int8 convolution and
matmul kernels (fast with AVX512-VNNI or AMX). Each unit runs through a fastdiff hook that calls its compiled
quantized graph; the unit's own weights are never changed, so ``remove()`` gives bit-identical outputs.

Batch sizes: diffusers' ``Upsample2D`` branches on ``batch >= 64``, so one exported graph cannot cover every
batch. A graph is exported per batch range (1, 2-63, 64 and more) when a call first needs it, and reuses the
calibrated observer statistics; inductor then compiles once per batch size (dynamic=False). Expect the first
call at a new batch size to take minutes on a small CPU.

Calibration: one pipeline call of ``calibration_batch`` inputs and ``calibration_steps`` steps with the
pipeline's own scheduler at apply time (seed 0), all steps observed.

Accelerators that hook inside the quantized blocks (``tome``, ``compile``, ``attention`` ...) would be bypassed
by the exported graphs; such a combination fails at the next call with an AcceleratorError. Hooks on the
denoiser or on whole blocks (``deepcache``, ``forecast``, ``cfg-interval``) compose.
"""

from __future__ import annotations

import functools
import inspect
import platform
from pathlib import Path

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.diffusers_compat import has_hooks
from fastdiff.core.hooks import HandleGroup, all_or_nothing, install_hook
from fastdiff.core.registry import AcceleratorError

HOOK_NAME = "fastdiff.quantize-static"
BATCH_RANGES = ((1, 1), (2, 63), (64, 1 << 16))  # Upsample2D: `if hidden_states.shape[0] >= 64`
RECOMPILE_LIMIT = 64  # one graph per batch size; dynamo's default of 8 would silently fall back to eager


def check_device(denoiser: torch.nn.Module) -> None:
    """Refuse what the X86 inductor int8 kernels cannot run: non-CPU devices, non-x86 CPUs, non-fp32 weights."""
    weight = next(denoiser.parameters())
    if weight.device.type != "cpu":
        raise AcceleratorError(
            f"quantize(mode=int8-static) runs oneDNN int8 kernels on x86 CPUs; the denoiser is on "
            f"{weight.device.type}. Use mode=int8-dynamic or int8-weight (or fp8 on a recent GPU) there"
        )
    if platform.machine().lower() not in ("x86_64", "amd64", "x86", "i686"):
        raise AcceleratorError(
            f"quantize(mode=int8-static) needs an x86 CPU (X86InductorQuantizer); this is {platform.machine()}"
        )
    if weight.dtype != torch.float32:
        raise AcceleratorError(f"quantize(mode=int8-static) needs float32 weights, the denoiser has {weight.dtype}")


def batch_range(batch: int) -> tuple[int, int]:
    for low, high in BATCH_RANGES:
        if low <= batch <= high:
            return low, high
    raise AcceleratorError(f"quantize(mode=int8-static): batch {batch} is above the supported {BATCH_RANGES[-1][1]}")


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)  # cached: read at every block call of the denoising loop


def has_vnni() -> bool:
    """Whether this x86 CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: assume a CPU recent enough
        return True
    return any(flag in flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def _positional(module: torch.nn.Module, args, kwargs) -> tuple:
    """The call's arguments in the class forward's order, defaults filled in (one structure for every call)."""
    signature = _signature(type(module))
    bound = signature.bind(module, *args, **kwargs)
    out = []
    for name, param in list(signature.parameters.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if bound.arguments.get(name):
                raise AcceleratorError(f"quantize(mode=int8-static): {type(module).__name__} got extra {name}")
        elif param.kind == param.POSITIONAL_OR_KEYWORD:
            out.append(bound.arguments.get(name, param.default))
        elif name in bound.arguments:
            raise AcceleratorError(f"quantize(mode=int8-static): keyword-only {name} of {type(module).__name__}")
    return tuple(out)


class _ClassForward(torch.nn.Module):
    """The unit's class forward, without the hooks on the unit (what is exported)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.inner = module

    def forward(self, *args):
        return type(self.inner).forward(self.inner, *args)


def _clone(value):
    return torch.utils._pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, value)


def _batch_of(named: tuple) -> int:
    tensors = [x for x in torch.utils._pytree.tree_leaves(named) if isinstance(x, torch.Tensor) and x.dim() > 0]
    return tensors[0].shape[0]


def _export(module: torch.nn.Module, named: tuple, low: int, high: int):
    """``torch.export`` of the module's class forward with dim 0 of every tensor as one batch dimension."""
    dim = None if low == high else torch.export.Dim("batch", min=low, max=high)

    def spec(x):
        return {0: dim} if dim is not None and isinstance(x, torch.Tensor) and x.dim() > 0 else None

    shapes = [tuple(torch.utils._pytree.tree_map(spec, v) for v in named)]
    with torch.no_grad():
        return torch.export.export(_ClassForward(module), named, dynamic_shapes=shapes).module()


def _observer_state(prepared: torch.nn.Module) -> dict:
    return {k: v.clone() for k, v in prepared.state_dict().items() if "activation_post_process" in k}


class _Unit:
    """One compile unit: calibrated observer statistics and a compiled int8 graph per batch range."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.inputs: list[tuple] = []
        self.observers: dict | None = None
        self.programs: dict[tuple[int, int], object] = {}

    def prepared(self, named: tuple, key: tuple[int, int]):
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

        quantizer = xiq.X86InductorQuantizer()
        # without VNNI, x86 int8 dot products saturate at 16 bits: the quantizer's reduce_range avoids it
        quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(reduce_range=not has_vnni()))
        return prepare_pt2e(_export(self.module, named, *key), quantizer)

    def calibrate(self) -> None:
        by_range: dict[tuple[int, int], list[tuple]] = {}
        for named in self.inputs:
            by_range.setdefault(batch_range(_batch_of(named)), []).append(named)
        key, inputs = max(by_range.items(), key=lambda item: len(item[1]))
        prepared = self.prepared(inputs[0], key)
        with torch.no_grad():
            for named in inputs:
                prepared(*named)
        self.observers = _observer_state(prepared)
        self.programs[key] = self.finish(prepared)
        self.inputs = []

    def finish(self, prepared):
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

        return torch.compile(convert_pt2e(prepared), dynamic=False)

    def program(self, named: tuple):
        key = batch_range(_batch_of(named))
        if key not in self.programs:  # same graph, other batch range: reuse the calibrated statistics
            prepared = self.prepared(named, key)
            missing = set(_observer_state(prepared)) ^ set(self.observers)
            if missing:
                raise AcceleratorError(
                    f"quantize(mode=int8-static): the graph for batch range {key} differs from the calibrated "
                    f"one ({len(missing)} observers do not match); calibrate with this batch size"
                )
            prepared.load_state_dict(self.observers, strict=False)
            self.programs[key] = self.finish(prepared)
        return self.programs[key]


class _CaptureHook(ModelHook):
    def __init__(self, unit: _Unit):
        super().__init__()
        self.unit = unit

    def pre_forward(self, module, *args, **kwargs):
        self.unit.inputs.append(_clone(_positional(module, args, kwargs)))
        return args, kwargs


class _StaticHook(ModelHook):
    """Runs the unit's compiled int8 graph instead of its forward."""

    def __init__(self, unit: _Unit, name: str):
        super().__init__()
        self.unit, self.name = unit, name
        self.inner: list[tuple[str, torch.nn.Module]] | None = None

    def new_forward(self, module, *args, **kwargs):
        if self.inner is None:  # the block's submodules, listed once (their hook registries can appear later)
            self.inner = [(n, m) for n, m in module.named_modules() if n]
        hooked = [n for n, m in self.inner if has_hooks(m)]
        if hooked:
            raise AcceleratorError(
                f"quantize(mode=int8-static) runs {self.name} as an exported int8 graph, which would bypass the "
                f"hooks added inside it since ({self.name}.{hooked[0]}); remove that accelerator or the quantization"
            )
        named = _positional(module, args, kwargs)
        program = self.unit.program(named)
        dynamo = torch._dynamo.config
        limit = dynamo.recompile_limit
        dynamo.recompile_limit = max(limit, RECOMPILE_LIMIT)  # for our calls only; restored below
        try:
            with torch._inductor.config.patch(freezing=True), torch.no_grad():
                return program(*named)
        finally:
            dynamo.recompile_limit = limit


def apply_static(fp, calibration_batch: int, calibration_steps: int):
    """Calibrate, quantize and hook every compile unit of ``fp.denoiser``; returns a removable HandleGroup."""
    from fastdiff.compress.compiled import compile_units
    from fastdiff.core.inputs import make_inputs

    denoiser = fp.denoiser
    check_device(denoiser)
    units = [(name, unit) for name, unit in compile_units(denoiser) if name]
    if not units:
        raise AcceleratorError(
            f"quantize(mode=int8-static): found no hook-free block with weights in {type(denoiser).__name__}"
        )
    states = {name: _Unit(module) for name, module in units}
    captures = [install_hook(m, _CaptureHook(states[n]), "fastdiff.quantize-capture") for n, m in units]
    bar_config = getattr(fp.pipe, "_progress_bar_config", None)
    fp.pipe.set_progress_bar_config(disable=True)
    try:
        fp(
            **make_inputs(fp.pipe, calibration_batch),
            num_inference_steps=calibration_steps,
            output_type="np",
            generator=torch.Generator().manual_seed(0),
        )
    finally:
        HandleGroup(captures).remove()
        if bar_config is None:
            fp.pipe.__dict__.pop("_progress_bar_config", None)
        else:
            fp.pipe._progress_bar_config = bar_config
    with all_or_nothing() as handles:
        for name, module in units:
            state = states[name]
            if not state.inputs:
                continue  # never called in this pipeline (e.g. a skipped branch): left in floating point
            state.calibrate()
            handles.append(install_hook(module, _StaticHook(state, name), HOOK_NAME))
    if not handles:
        raise AcceleratorError("quantize(mode=int8-static): the calibration call ran none of the denoiser's blocks")
    return HandleGroup(handles), [name for name, _ in units if states[name].observers is not None]
