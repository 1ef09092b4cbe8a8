"""Text specs for accelerators: ``NAME(key=value, ...)``, several joined by ``;``.

A value in double quotes is taken as it is (``path="/tmp/a,b.json"``, ``fit="none"``): inside them ``,``, ``;``,
parentheses and outer spaces are part of the value, and ``\\"`` / ``\\\\`` stand for ``"`` / ``\\``.
``str(config)`` quotes the strings that need it, so every valid config round-trips.

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

from fastdiff.core.registry import Accelerator, AcceleratorError, field_types, get, variant_of

_SPEC = re.compile(r"^\s*([A-Za-z][\w\-+.]*)\s*(?:\((.*)\))?\s*$", re.S)


def parse(spec: str | Accelerator | list) -> list[Accelerator]:
    """Parse a spec string (or pass through configs) into a list of accelerator configs."""
    if isinstance(spec, Accelerator):
        return [spec]
    if isinstance(spec, (list, tuple)):
        return [c for item in spec for c in parse(item)]
    if not isinstance(spec, str):
        raise AcceleratorError(f"expected a spec string or an Accelerator config, got {type(spec).__name__}")
    return [parse_one(part) for part in split_outside_quotes(spec, ";") if part.strip()]


def runs_in_process_group(spec) -> bool:
    """Whether any accelerator in ``spec`` declares it runs across processes (``kind == "parallel"``): such
    specs are launched on ``devices`` ranks by ``fastdiff bench/generate --devices N``.

    Example::

        runs_in_process_group("deepcache(interval=3);parallel(mode=cfg,devices=2)")   # True
    """
    return any(config.kind == "parallel" for config in parse(spec))


def split_outside_quotes(text: str, sep: str) -> list[str]:
    """Split ``text`` on ``sep`` where it is not inside a double-quoted value."""
    parts, start, quoted, i = [], 0, False, 0
    while i < len(text):
        char = text[i]
        if quoted and char == "\\":
            i += 1  # the next character is escaped
        elif char == '"':
            quoted = not quoted
        elif char == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quoted:
        raise AcceleratorError(f"unterminated quote in accelerator spec {text!r}")
    parts.append(text[start:])
    return parts


def unquote(value: str, where: str) -> tuple[str, bool]:
    """``(text, quoted)``: a bare value as it is, or the content of a double-quoted one, unescaped."""
    if '"' not in value:
        return value, False
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        raise AcceleratorError(f'{where}: quote the whole value (key="..."), got {value!r}')
    out, i, inner = [], 0, value[1:-1]
    while i < len(inner):
        char = inner[i]
        if char == "\\" and inner[i + 1 : i + 2] in ('"', "\\"):
            char, i = inner[i + 1], i + 1
        elif char == '"':
            raise AcceleratorError(f'{where}: write a quote inside a quoted value as \\", got {value!r}')
        out.append(char)
        i += 1
    return "".join(out), True


def parse_one(text: str) -> Accelerator:
    match = _SPEC.match(text)
    if not match:
        raise AcceleratorError(f"malformed accelerator spec {text!r}; expected NAME or NAME(key=value,...)")
    name, body = match.group(1), match.group(2)
    cls, where, items = get(name), name, []
    for item in split_outside_quotes(body or "", ","):
        if not item.strip():
            continue
        if "=" not in item:
            raise AcceleratorError(f"{name}: option {item.strip()!r} must be key=value")
        items.append(tuple(s.strip() for s in item.split("=", 1)))
    if cls.variant_option:  # a name shared by several classes: the option's value picks one
        picked = next((v for k, v in items if k == cls.variant_option), None)
        cls = get(name, None if picked is None else unquote(picked, f"{name}.{cls.variant_option}")[0])
        where = f"{name}({cls.variant_option}={variant_of(cls)})"
    types_ = field_types(cls)  # type: ignore[arg-type]  # a class hashes by identity
    kwargs: dict[str, Any] = {}
    for key, value in items:
        if key not in types_:
            raise AcceleratorError(f"{where}: unknown option {key!r}; allowed: {', '.join(types_) or 'none'}")
        if key in kwargs:
            raise AcceleratorError(f"{name}: option {key!r} given twice")
        text, quoted = unquote(value, f"{name}.{key}")
        kwargs[key] = convert(text, types_[key], f"{name}.{key}", quoted)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required option is missing
        raise AcceleratorError(f"{name}: {exc}") from exc


def convert(text: str, annotation: Any, where: str, quoted: bool = False) -> Any:
    """Convert ``text`` to the annotated type, or raise naming what is allowed (a quoted value is never None)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        for option in allowed:
            if text == str(option):
                return option
        raise AcceleratorError(f"{where}: {text!r} is not allowed; choose one of {', '.join(map(str, allowed))}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if type(None) in args and not quoted and text.lower() in ("none", "null"):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return convert(text, arg, where, quoted)
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
