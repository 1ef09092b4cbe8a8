"""Options declared once: an accelerator field's bounds sit on the field, its allowed values in its ``Literal``
type, and the ``Accelerator`` base checks both on construction (the annotation also says integer or number, and
whether ``None`` is allowed), for a spec and for a config built in Python alike. ``validate()`` keeps only the
rules that tie several fields together.

Example::

    @register
    @dataclass(frozen=True)
    class Blur(Accelerator):
        spec_name, kind = "blur", "cache"
        radius: int = option(2, ge=1)                     # "blur: radius must be an integer >= 1, got 0"
        strength: float = option(0.5, gt=0, le=1)         # "... must be a number in (0, 1], got 2.0"
        mode: Literal["box", "gauss"] = "box"           # "... must be one of box, gauss, got 'disk'"
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

BOUNDS = "fastdiff_bounds"  # the field metadata key


@dataclass(frozen=True)
class Bounds:
    """Allowed values of one option: an interval (each end open or closed, or absent) or a set of choices."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple = ()

    def interval(self) -> str:
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{'<=' if self.le is not None else '<'} {high[:-1]}"
        return ""

    def holds(self, value) -> bool:
        if self.choices:
            return value in self.choices
        return not (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (self.lt is not None and not value < self.lt)
        )


def option(default, *, ge=None, gt=None, le=None, lt=None, choices=()) -> Any:
    """A dataclass field with ``default`` whose values must lie in the given interval or among ``choices``."""
    return dataclasses.field(default=default, metadata={BOUNDS: Bounds(ge, gt, le, lt, tuple(choices))})


def _literal(annotation) -> tuple:
    """The allowed values of a ``Literal`` annotation (or of ``Literal[...] | None``), else ()."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((_literal(a) for a in typing.get_args(annotation) if _literal(a)), ())
    return ()


def _base_type(annotation) -> tuple[type | None, bool]:
    """(int, float, str or None for other types; whether None is allowed) of a field's resolved annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        allows_none = type(None) in args
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 and rest[0] in (int, float, str) else None), allows_none
    return (annotation if annotation in (int, float, str) else None), False


def describe(kind: type | None, bounds: Bounds, allows_none: bool) -> str:
    """What an option takes, as an error message says it: "an integer >= 1 or none", "one of a, b"."""
    if bounds.choices:
        text = f"one of {', '.join(str(c) for c in bounds.choices)}"
    else:
        nouns: dict[type | None, str] = {int: "an integer", float: "a number"}
        noun = nouns.get(kind, "a value")
        text = f"{noun} {bounds.interval()}".strip()
    return f"{text} or none" if allows_none else text


def check_options(config, hints: dict[str, Any]) -> None:
    """``AcceleratorError`` naming the first option of ``config`` outside its declared type or bounds."""
    from fastdiff.core.registry import AcceleratorError

    for f in dataclasses.fields(config):
        bounds, allowed = f.metadata.get(BOUNDS), _literal(hints[f.name])
        if bounds is None and not allowed:
            continue
        value = getattr(config, f.name)
        kind, allows_none = _base_type(hints[f.name])
        if value is None and allows_none:
            continue
        if allowed:  # True == 1: a bool is one of the values only where the type lists it
            if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed):
                raise AcceleratorError(
                    f"{config.spec_name}: {f.name} must be {describe(None, Bounds(choices=allowed), allows_none)}, "
                    f"got {value!r}"
                )
            continue
        ok = not isinstance(value, bool) and (
            (kind is int and isinstance(value, int))
            or (kind is float and isinstance(value, (int, float)) and math.isfinite(value))
            or kind not in (int, float)
        )
        if not (ok and (bounds is None or bounds.holds(value))):
            raise AcceleratorError(
                f"{config.spec_name}: {f.name} must be {describe(kind, bounds or Bounds(), allows_none)}, got {value!r}"
            )


__all__ = ["Bounds", "option", "check_options", "describe"]
