"""The private diffusers internals fastdiff uses, checked against the installed diffusers; nobody else names them."""

from __future__ import annotations

import re
from pathlib import Path

import diffusers
import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook
from packaging.specifiers import SpecifierSet

from fastdiff.core import diffusers_compat as compat

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = re.compile(
    r"\"_diffusers_hook\"|\._diffusers_hook\b|\._hook_order\b|\._module_ref\b|\._fn_refs\b|_is_stateful\s*=|"
    r"\._is_stateful\b|_get_parameter_from_args_kwargs|hooks\._helpers|hooks\.context_parallel|"
    r"hooks import context_parallel|create_new_forward"
)


class Tag(ModelHook):
    def post_forward(self, module, output):
        return output + 1


def test_installed_diffusers_is_in_the_range_pyproject_declares():
    declared = re.search(r'^\s*"(diffusers[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == f"diffusers{compat.SUPPORTED}"
    assert diffusers.__version__ in SpecifierSet(compat.SUPPORTED)
    assert all(v in SpecifierSet(compat.SUPPORTED) for v in compat.CHECKED)


def test_registry_lookup_order_chain_and_drop():
    lin = torch.nn.Linear(2, 2)
    assert compat.hook_registry(lin) is None and not compat.has_hooks(lin)
    registry = HookRegistry.check_if_exists_or_initialize(lin)
    assert compat.hook_registry(lin) is registry and not compat.has_hooks(lin)
    registry.register_hook(Tag(), "inner")
    registry.register_hook(Tag(), "outer")
    assert compat.has_hooks(lin) and compat.hook_names(registry) == ["inner", "outer"]
    assert compat.registry_module(registry) is lin
    assert compat.is_hook_chain(lin.forward, lin)
    assert not compat.is_hook_chain(lin.forward, torch.nn.Linear(2, 2))
    x = torch.zeros(1, 2)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias) + 2)
    registry.remove_hook("outer")
    registry.remove_hook("inner")
    compat.drop_registry(lin)
    assert compat.hook_registry(lin) is None


def test_stateful_hooks_are_reset_by_diffusers():
    class Counter(compat.StatefulHook):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def pre_forward(self, module, *args, **kwargs):
            self.calls += 1
            return args, kwargs

        def reset_state(self, module):
            self.calls = 0
            return module

    lin, hook = torch.nn.Linear(2, 2), Counter()
    HookRegistry.check_if_exists_or_initialize(lin).register_hook(hook, "count")
    lin(torch.zeros(1, 2))
    assert hook.calls == 1 and compat.is_stateful(hook) and not compat.is_stateful(Tag())
    lin._diffusers_hook.reset_stateful_hooks()
    assert hook.calls == 0
    plain = Tag()
    compat.set_stateful(plain, True)
    assert compat.is_stateful(plain)


def test_block_metadata_finds_the_hidden_states_argument():
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    metadata_cls, registry = compat.block_metadata_registry()
    io = registry.get(FluxTransformerBlock)
    assert isinstance(io, metadata_cls)
    hidden = torch.zeros(1, 3, 4)
    assert compat.block_argument(io, io.hidden_states_argument_name, (hidden,), {}) is hidden
    assert compat.block_argument(io, io.hidden_states_argument_name, (), {"hidden_states": hidden}) is hidden


def test_context_parallel_hooked_names_the_planned_submodules():
    from fastdiff.zoo.tiny_flow import make_flow_pipeline

    denoiser = make_flow_pipeline("tiny-flux", "test", seed=0).transformer
    hooked = compat.context_parallel_hooked(denoiser, denoiser._cp_plan)
    assert hooked and all(isinstance(m, torch.nn.Module) for m in hooked)
    assert {name.split("---")[0] for name in hooked.values()} == {"cp_input", "cp_output"}
    assert denoiser in hooked  # the transformer's own inputs are split


@pytest.mark.parametrize("path", sorted((ROOT / "fastdiff").rglob("*.py")), ids=lambda p: p.name)
def test_only_the_compat_module_names_private_internals(path):
    if path.name == "diffusers_compat.py":
        return
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert not found, found
