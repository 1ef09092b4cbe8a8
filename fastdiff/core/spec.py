"""Text specs for accelerators: ``NAME(key=value, ...)``, several joined by ``;``.

Example::

    import fastdiff
    configs = fastdiff.parse("scheduler(name=dpm++2m,steps=20);deepcache(interval=3)")
    assert fastdiff.parse(";".join(map(str, configs))) == configs
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal

from fastdiff.core.registry import Accelerator, AcceleratorError, field_types, get

_SPEC = re.compile(r"^\s*([A-Za-z][\w\-+.]*)\s*(?:\((.*)\))?\s*$", re.S)


def parse(spec: str | Accelerator | list) -> list[Accelerator]:
    """Parse a spec string (or pass through configs) into a list of accelerator configs."""
    if isinstance(spec, Accelerator):
        return [spec]
    if isinstance(spec, (list, tuple)):
        return [c for item in spec for c in parse(item)]
    if not isinstance(spec, str):
        raise AcceleratorError(f"expected a spec string or an Accelerator config, got {type(spec).__name__}")
    return [parse_one(part) for part in spec.split(";") if part.strip()]


def parse_one(text: str) -> Accelerator:
    match = _SPEC.match(text)
    if not match:
        raise AcceleratorError(f"malformed accelerator spec {text!r}; expected NAME or NAME(key=value,...)")
    name, body = match.group(1), match.group(2)
    cls = get(name)
    types_ = field_types(cls)
    kwargs: dict[str, Any] = {}
    for item in (body or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise AcceleratorError(f"{name}: option {item.strip()!r} must be key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in types_:
            raise AcceleratorError(f"{name}: unknown option {key!r}; allowed: {', '.join(types_) or 'none'}")
        if key in kwargs:
            raise AcceleratorError(f"{name}: option {key!r} given twice")
        kwargs[key] = convert(value, types_[key], f"{name}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required option is missing
        raise AcceleratorError(f"{name}: {exc}") from exc


def convert(text: str, annotation: Any, where: str) -> Any:
    """Convert ``text`` to the annotated type, or raise naming what is allowed."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        for option in allowed:
            if text == str(option):
                return option
        raise AcceleratorError(
            f"{where}: {text!r} is not allowed; choose one of {', '.join(map(str, allowed))}"
        )
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if type(None) in args and text.lower() in ("none", "null"):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return convert(text, arg, where)
            except AcceleratorError as exc:
                errors.append(str(exc))
        raise AcceleratorError("; ".join(errors))
    if annotation is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise AcceleratorError(f"{where}: {text!r} is not a boolean; use true or false")
    if annotation in (int, float):
        try:
            return annotation(text)
        except ValueError:
            raise AcceleratorError(f"{where}: {text!r} is not a valid {annotation.__name__}") from None
    if annotation is str:
        return text
    raise AcceleratorError(f"{where}: cannot parse options of type {annotation}")
