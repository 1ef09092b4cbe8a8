"""Several config classes under one spec name, told apart by one option (the registry's variants)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

import fastdiff
from fastdiff.core import registry
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.core.spec import parse, runs_in_process_group


@pytest.fixture
def scratch(monkeypatch):
    """A copy of the registry that the test may register into."""
    registry.available()
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    monkeypatch.setattr(registry, "VARIANTS", {k: dict(v) for k, v in registry.VARIANTS.items()})


@dataclasses.dataclass(frozen=True)
class Tool(Accelerator):
    spec_name = "tool"
    kind = "cache"
    variant_option = "flavor"
    variants = ("plain", "fancy")


def _register_both():
    @register
    @dataclasses.dataclass(frozen=True)
    class Fancy(Tool):  # registered first: the default is still the first of ``variants``
        flavor: Literal["fancy"] = "fancy"
        shine: int = 1

    @register
    @dataclasses.dataclass(frozen=True)
    class Plain(Tool):
        flavor: Literal["plain"] = "plain"
        size: int = 2

    return Plain, Fancy


def test_the_option_picks_the_class_and_each_takes_only_its_own_options(scratch):
    plain, fancy = _register_both()
    assert registry.get("tool") is plain and registry.VARIANTS["tool"] == {"plain": plain, "fancy": fancy}
    assert parse("tool") == [plain()] and parse("tool(size=3)") == [plain(size=3)]
    assert parse('tool(flavor="fancy",shine=4)') == [fancy(shine=4)]
    for config in (plain(), plain(size=5), fancy(), fancy(shine=7)):
        assert parse(str(config)) == [config], str(config)
    assert str(fancy()) == "tool(flavor=fancy)" and registry.available().count("tool") == 1
    with pytest.raises(AcceleratorError, match=r"tool\(flavor=plain\): unknown option 'shine'; allowed: flavor, size"):
        parse("tool(flavor=plain,shine=2)")
    with pytest.raises(AcceleratorError, match="tool: flavor must be one of plain, fancy, got 'odd'"):
        parse("tool(flavor=odd)")
    with pytest.raises(AcceleratorError, match="given twice"):
        parse("tool(flavor=fancy,flavor=plain)")
    with pytest.raises(AcceleratorError, match="Plain is flavor=plain, got flavor='fancy'"):
        plain(flavor="fancy")


def test_registering_refuses_what_cannot_be_told_apart(scratch):
    _register_both()
    with pytest.raises(TypeError, match=r"tool\(flavor=plain\) is already registered"):

        @register
        @dataclasses.dataclass(frozen=True)
        class Other(Tool):
            flavor: Literal["plain"] = "plain"

    with pytest.raises(TypeError, match="already registered"):

        @register
        @dataclasses.dataclass(frozen=True)
        class Lone(Accelerator):  # a plain class cannot take a shared name
            spec_name = "tool"
            kind = "cache"

    with pytest.raises(TypeError, match="first field must be 'flavor'"):

        @register
        @dataclasses.dataclass(frozen=True)
        class Late(Tool):
            size: int = 1
            flavor: Literal["fancy"] = "fancy"


def test_parallel_modes_are_classes_under_one_name():
    classes = registry.VARIANTS["parallel"]
    assert list(classes) and set(classes) == {"cfg", "async", "cfg+async", "ulysses", "ring", "cfg+ulysses"}
    assert registry.get("parallel") is classes["cfg"]
    specs = [
        "parallel(mode=cfg)",
        "parallel(mode=async,warmup=1,extrapolate=1)",
        "parallel(mode=cfg+async,devices=6)",
    ]
    for spec in specs:
        (config,) = fastdiff.parse(spec)
        assert type(config) is classes[config.mode] and str(config) == spec and runs_in_process_group(spec)
    assert {f.name for f in dataclasses.fields(classes["cfg"])} == {"mode", "devices"}
    assert fastdiff.parse("parallel(devices=2)") == [classes["cfg"]()]
