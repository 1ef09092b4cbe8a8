"""Options declared once: every accelerator's bounds and allowed values live on its fields and are checked by the
``Accelerator`` base, for a spec and for a config built in Python alike."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fastdiff.core import registry
from fastdiff.core.options import BOUNDS, Bounds, describe
from fastdiff.core.registry import AcceleratorError, field_types
from fastdiff.core.spec import parse

REQUIRED = {"path": "/tmp/none"}  # the one option some accelerators need, never read on construction


def every_class() -> list[type]:
    registry.available()
    out = set(registry.REGISTRY.values())
    for family in registry.VARIANTS.values():
        out.update(family.values())
    return sorted(out, key=lambda c: (c.spec_name, c.__name__))


def declared() -> list[tuple[type, str, Bounds]]:
    return [
        (cls, f.name, f.metadata[BOUNDS])
        for cls in every_class()
        for f in dataclasses.fields(cls)
        if BOUNDS in f.metadata
    ]


def build(cls, **values):
    needed = {
        f.name: REQUIRED[f.name]
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**{**needed, **values})


def outside(bounds: Bounds, kind):
    """A value just outside ``bounds``."""
    if bounds.choices:
        return max(bounds.choices) + 1
    if bounds.ge is not None:
        return bounds.ge - 1
    if bounds.gt is not None:
        return bounds.gt
    return (bounds.le if bounds.le is not None else bounds.lt) + (1 if kind is int else 0.5)


def test_the_accelerators_declare_their_bounds_on_their_fields():
    names = {(cls.spec_name, name) for cls, name, _ in declared()}
    for expected in [
        ("deepcache", "interval"),
        ("blockcache", "threshold"),
        ("forecast", "warmup"),
        ("scheduler", "steps"),
        ("prune", "ratio"),
        ("lowrank", "energy"),
        ("tome", "max_downsample"),
        ("cfg-interval", "start"),
        ("parallel", "devices"),
        ("student", "steps"),
    ]:
        assert expected in names


@pytest.mark.parametrize("cls,name,bounds", declared(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_value_outside_the_declared_bounds_is_refused_naming_the_option(cls, name, bounds):
    hint = field_types(cls)[name]
    kind = next((a for a in (typing.get_args(hint) or (hint,)) if a in (int, float)), None)
    build(cls)  # the defaults are inside
    bad = outside(bounds, kind)
    with pytest.raises(AcceleratorError, match=rf"^{cls.spec_name}: {name} must be .*, got {bad!r}$"):
        build(cls, **{name: bad})
    if kind is int:  # a number where an integer is needed, and a bool, are refused too
        said = "one of" if bounds.choices else "an integer"
        for wrong in (True, 1.5):
            with pytest.raises(AcceleratorError, match=f"{name} must be {said}"):
                build(cls, **{name: wrong})


def test_messages_say_what_is_allowed():
    assert describe(int, Bounds(ge=1), True) == "an integer >= 1 or none"
    assert describe(float, Bounds(gt=0, le=1), False) == "a number in (0, 1]"
    assert describe(float, Bounds(ge=0, le=1), False) == "a number in [0, 1]"
    assert describe(int, Bounds(choices=(1, 2, 4, 8)), False) == "one of 1, 2, 4, 8"
    with pytest.raises(AcceleratorError, match=r"^lowrank: energy must be a number in \(0, 1\], got 1.5$"):
        parse("lowrank(energy=1.5)")
    with pytest.raises(AcceleratorError, match="blockcache: threshold must be a number >= 0 or none, got nan"):
        build(registry.get("blockcache"), threshold=float("nan"))


def test_literal_options_are_checked_for_configs_built_in_python():
    deepcache, forecast = registry.get("deepcache"), registry.get("forecast")
    with pytest.raises(AcceleratorError, match=r"^deepcache: schedule must be one of uniform, nonuniform, got 'x'$"):
        deepcache(schedule="x")
    with pytest.raises(AcceleratorError, match="forecast: order must be one of 1, 2, got True"):
        forecast(order=True)  # True == 1, but it is not the integer 1
    assert forecast(order=2).order == 2
