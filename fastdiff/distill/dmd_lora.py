"""LoRA mode of ``fastdiff distill dmd``: the generator and the fake score as two peft adapters on one frozen base
(the teacher), so training holds one copy of the base weights and optimizer state for the adapters only.

The three denoisers of distribution matching are views of the one base: the teacher (adapters off), the fake score
(adapter ``fake``) and the generator (adapter ``generator``). A view's ``forward`` switches the base to its adapter
for the call; its parameters, ``requires_grad_`` and ``state_dict`` are its adapter's only, so the training loop,
the fake score's optimizer and the checkpoint see exactly what they train. The student is saved with the
generator's adapter merged into the base weights (``merged_state_dict``): a plain pipeline like full mode's.

Example::

    base = fresh_copy(teacher_denoiser)
    views = add_adapters(base, rank=16)          # {"teacher": ..., "fake": ..., "generator": ...}
    out = views["generator"](sample=z, timestep=t, return_dict=False)[0]
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from fastdiff.distill.common import DistillError
from fastdiff.distill.consistency import LORA_TARGETS, present_targets

GENERATOR, FAKE = "generator", "fake"
# LoRA targets: the consistency LoRA's (diffusers' LCM-LoRA script), plus joint attention's text side (SD3, Flux)
TARGETS = (
    *LORA_TARGETS,
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "ff_context.net.0.proj",
    "ff_context.net.2",
)


def _tuner_layers(base):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in base.modules() if isinstance(m, BaseTunerLayer)]


def _lora_params(base, name: str) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in base.named_parameters() if "lora_" in n and f".{name}." in n + "."]


@contextlib.contextmanager
def active(base, name: str | None):
    """``base`` computing with adapter ``name`` (None: the base alone); every adapter's requires_grad is kept."""
    flags = [(p, p.requires_grad) for n, p in base.named_parameters() if "lora_" in n]
    layers = _tuner_layers(base)
    try:
        for layer in layers:
            if name is None:
                layer.enable_adapters(False)
            else:
                layer.enable_adapters(True)
                layer.set_adapter(name)
        for p, flag in flags:  # peft's switches set requires_grad: put every flag back
            p.requires_grad_(flag)
        yield base
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class AdapterView(torch.nn.Module):
    """One role of the shared base: its forward runs the base with adapter ``name`` (None: none); its parameters
    and state are that adapter's (the base is held, not registered, so they never include the base weights)."""

    def __init__(self, base, name: str | None):
        super().__init__()
        object.__setattr__(self, "base", base)
        self.name = name
        self.config = base.config

    def forward(self, *args, **kwargs):
        with active(self.base, self.name):
            return type(self.base).forward(self.base, *args, **kwargs)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return iter([] if self.name is None else _lora_params(self.base, self.name))

    def parameters(self, recurse: bool = True):
        return (p for _, p in self.named_parameters())

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def state_dict(self, *args, **kwargs):
        return {n: p.detach().clone() for n, p in self.named_parameters()}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        own = dict(self.named_parameters())
        if strict and set(own) != set(state_dict):
            raise DistillError(
                f"LoRA state of adapter {self.name!r} does not match: {sorted(set(own) ^ set(state_dict))[:3]}"
            )
        with torch.no_grad():
            for n, value in state_dict.items():
                own[n].copy_(value)
        return torch.nn.modules.module._IncompatibleKeys([], [])


class MergedView(torch.nn.Module):
    """``state_dict()``: the base with adapter ``name`` merged, under the plain model's keys (snapshots, student)."""

    def __init__(self, base, name: str):
        super().__init__()
        object.__setattr__(self, "base", base)
        self.name = name

    def state_dict(self, *args, **kwargs):
        return merged_state_dict(self.base, self.name)


def add_adapters(base, rank: int, seed: int = 0) -> dict[str, AdapterView]:
    """Two LoRA adapters (``generator``, ``fake``; B at zero: both start as the base) on the frozen ``base``, and
    the three views. A's random start comes from ``seed`` (a resumed run starts where the first did). DistillError
    when the base has none of the target layers."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = present_targets(base, TARGETS)
    if not targets:
        raise DistillError(f"--lora: {type(base).__name__} has none of the LoRA target layers {TARGETS}")
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=True)
    base.requires_grad_(False)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")  # two adapters: intended
        torch.manual_seed(seed)
        for name in (GENERATOR, FAKE):
            inject_adapter_in_model(config, base, adapter_name=name)
    for n, p in base.named_parameters():
        p.requires_grad_("lora_" in n)
    return {
        "teacher": AdapterView(base, None),
        FAKE: AdapterView(base, FAKE),
        GENERATOR: AdapterView(base, GENERATOR),
    }


def merged_state_dict(base, name: str) -> dict[str, torch.Tensor]:
    """The base's weights with adapter ``name``'s update added, under the keys of the model without adapters."""
    deltas = {}
    for module_name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and name in getattr(module, "lora_A", {}):
            deltas[f"{module_name}.base_layer.weight"] = module.get_delta_weight(name)
    out = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        value = value + deltas[key] if key in deltas else value
        out[key.replace(".base_layer.", ".")] = value.detach().clone()
    return out


__all__ = [
    "GENERATOR",
    "FAKE",
    "TARGETS",
    "AdapterView",
    "MergedView",
    "active",
    "add_adapters",
    "merged_state_dict",
]
