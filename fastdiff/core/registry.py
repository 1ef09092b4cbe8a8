"""Accelerator base class, the name registry, and the declarations that order and refuse combinations.

Every accelerator is a frozen dataclass registered with ``@register``. It declares:

- ``spec_name``: the name used in text specs (``deepcache(interval=3)``);
- ``kind``: its family; kinds are applied in ``KIND_ORDER`` (weights first, compile last);
- ``touches``: what it changes (``"scheduler"``, ``"denoiser.forward"``, ``"denoiser.weights"`` ...);
- ``exclusive``: touched resources that no other accelerator may touch at the same time;
- ``conflicts_with``: names it cannot be combined with (declared on one side: ``conflict_reason`` reads both);
- ``runs_on_xla``: whether it runs on a torch-xla device (TPU); others are refused there (``check_device``).

Several classes may share one ``spec_name`` when they declare the option that tells them apart
(``variant_option``, e.g. ``"mode"``) and its values in order (``variants``; the first is taken when a spec leaves
the option out): each class declares that option as its first field, with its own value as the default, and
carries only its own other options. A spec picks the class by that option's value before reading the rest
(``VARIANTS`` holds them by name and value; ``REGISTRY`` holds the default one).

Example::

    from dataclasses import dataclass
    from fastdiff.core.registry import Accelerator, register

    @register
    @dataclass(frozen=True)
    class Noop(Accelerator):
        spec_name = "noop"
        kind = "cache"
        touches = frozenset()

        def apply(self, fp):
            from fastdiff.core.hooks import Handle
            return Handle(lambda: None)
"""

from __future__ import annotations

import dataclasses
import functools
import typing
import warnings
from typing import Any, ClassVar

from fastdiff.core.options import check_options
from fastdiff.core.plugins import ACCELERATORS, load_plugins

KIND_ORDER = ("compress", "attention", "cache", "guidance", "parallel", "text", "sampler", "compile")

REGISTRY: dict[str, type[Accelerator]] = {}
VARIANTS: dict[str, dict[str, type[Accelerator]]] = {}  # names shared by several classes: value -> class
ALIASES: dict[str, str] = {}  # an old spec name -> the name it was renamed to (still parsed, with a warning)


class AcceleratorError(ValueError):
    """Bad accelerator name, option, value or combination."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """Base of every accelerator config. Subclasses are frozen dataclasses; ``apply`` does the work."""

    spec_name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    touches: ClassVar[frozenset[str]] = frozenset()
    exclusive: ClassVar[frozenset[str]] = frozenset()
    conflicts_with: ClassVar[frozenset[str]] = frozenset()
    needs: ClassVar[tuple[str, ...]] = ()  # optional packages apply imports (fastdiff.core.optional names their extra)
    runs_on_xla: ClassVar[bool] = False  # True only where a test ran it on torch-xla (tests/xla/test_xla.py)
    # the changed denoiser is saved and reloaded through diffusers' from_config (new widths in its config: prune)
    rebuilt_from_config: ClassVar[bool] = False
    # classes sharing a spec_name: the option whose value picks one, and its values (the first: the default)
    variant_option: ClassVar[str] = ""
    renamed_from: ClassVar[tuple[str, ...]] = ()  # old spec names, still accepted with a FutureWarning
    variants: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if self.variant_option:
            own = variant_of(type(self))
            if getattr(self, self.variant_option) != own:
                raise AcceleratorError(
                    f"{self.spec_name}: {type(self).__name__} is {self.variant_option}={own}, got "
                    f"{self.variant_option}={getattr(self, self.variant_option)!r}"
                )
        check_options(self, field_types(type(self)))  # type: ignore[arg-type]  # a class hashes by identity
        self.validate()

    def validate(self) -> None:
        """Raise AcceleratorError where options break a rule that ties several of them together (each option's
        own bounds are declared on its field with ``fastdiff.core.options.option``). Called on construction."""

    def apply(self, fp) -> Any:
        """Change ``fp`` (a FastPipeline) and return a Handle whose ``remove()`` undoes exactly that."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The first option, and every other that differs from its default."""
        out = {}
        for i, f in enumerate(dataclasses.fields(self)):
            value = getattr(self, f.name)
            if i == 0 or f.default is dataclasses.MISSING or value != f.default:
                out[f.name] = value
        return out

    def __str__(self) -> str:
        opts = ",".join(f"{k}={_format_value(v)}" for k, v in self.options().items())
        return f"{self.spec_name}({opts})" if opts else self.spec_name


def register(cls: type[Accelerator]) -> type[Accelerator]:
    """Class decorator: make ``cls`` reachable by its ``spec_name`` in specs and ``FastPipeline.accelerate``."""
    name = cls.spec_name
    if not name or cls.kind not in KIND_ORDER:
        raise TypeError(f"{cls.__name__} needs a spec_name and a kind in {KIND_ORDER}, got kind={cls.kind!r}")
    ALIASES.update(dict.fromkeys(cls.renamed_from, name))
    taken = REGISTRY.get(name)
    if not cls.variant_option:
        if taken is not None and taken is not cls:
            raise TypeError(f"accelerator name {name!r} is already registered by {taken}")
        REGISTRY[name] = cls
        return cls
    value, family = variant_of(cls), VARIANTS.setdefault(name, {})
    if taken is not None and (taken.variant_option, taken.variants) != (cls.variant_option, cls.variants):
        raise TypeError(
            f"{cls.__name__}: accelerator name {name!r} is already registered by {taken}, which is "
            f"not told apart by {cls.variant_option}={'|'.join(cls.variants)}"
        )
    if family.get(value, cls) is not cls:
        raise TypeError(f"{name}({cls.variant_option}={value}) is already registered by {family[value]}")
    family[value] = cls
    REGISTRY[name] = family.get(cls.variants[0], cls)
    return cls


def variant_of(cls: type[Accelerator]) -> str:
    """The value of ``cls.variant_option`` that picks ``cls``: the default of that option, its first field."""
    fields = dataclasses.fields(cls)
    first = fields[0] if fields else None
    if first is None or first.name != cls.variant_option or first.default not in cls.variants:
        raise TypeError(
            f"{cls.__name__}: its first field must be {cls.variant_option!r} with a default among {cls.variants}"
        )
    return first.default


def _load_accelerators() -> None:
    # Importing every module of every family (the fastdiff.accelerators entry points) runs their @register.
    load_plugins(ACCELERATORS, packages=True)


def available() -> list[str]:
    """Names of all registered accelerators."""
    _load_accelerators()
    return sorted(REGISTRY)


def get(name: str, variant: str | None = None) -> type[Accelerator]:
    """The class of ``name``; for a name shared by several classes, the one ``variant`` picks (None: the default)."""
    _load_accelerators()
    if name in ALIASES and name not in REGISTRY:
        warnings.warn(
            f"{name}(...) is now {ALIASES[name]}(...); the old name will go in a later release",
            FutureWarning,
            stacklevel=4,
        )
        name = ALIASES[name]
    if name not in REGISTRY:
        raise AcceleratorError(f"unknown accelerator {name!r}; available: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    if variant is None or not cls.variant_option:
        return cls
    family = VARIANTS[name]
    if variant not in family:
        allowed = [v for v in cls.variants if v in family]
        raise AcceleratorError(f"{name}: {cls.variant_option} must be one of {', '.join(allowed)}, got {variant!r}")
    return family[variant]


@functools.cache
def field_types(cls: type[Accelerator]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def conflict_reason(a: Accelerator, b: Accelerator) -> str | None:
    """Why ``a`` and ``b`` cannot be active together, or None if they can."""
    if a.spec_name in b.conflicts_with or b.spec_name in a.conflicts_with:
        return "they are declared incompatible"
    shared = (a.exclusive & b.touches) | (b.exclusive & a.touches)
    if shared:
        return f"both change {', '.join(sorted(shared))}"
    if a.spec_name == b.spec_name and a != b:
        return f"one {a.spec_name} at a time (remove the active one to change its options)"
    return None


def check_conflicts(active: list[Accelerator], new: list[Accelerator]) -> None:
    """Raise AcceleratorError naming both accelerators if any new one conflicts with another."""
    for i, a in enumerate(new):
        for b in list(active) + new[:i]:
            reason = conflict_reason(a, b)
            if reason:
                raise AcceleratorError(f"{a} conflicts with {b}: {reason}")


def check_device(configs: list[Accelerator], device) -> None:
    """Refuse accelerators that cannot run on ``device`` (a torch.device); only XLA devices restrict any."""
    if getattr(device, "type", device) != "xla":
        return
    refused = [str(c) for c in configs if not c.runs_on_xla]
    if refused:
        _load_accelerators()
        runners = sorted(name for name, cls in REGISTRY.items() if cls.runs_on_xla)
        raise AcceleratorError(
            f"{', '.join(refused)} cannot run on the XLA device {device}; accelerators that run under XLA: "
            f"{', '.join(runners)}"
        )


def apply_order(configs: list[Accelerator]) -> list[Accelerator]:
    """Sort by kind (stable within a kind)."""
    return sorted(configs, key=lambda c: KIND_ORDER.index(c.kind))


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, str) and (
        v != v.strip() or v.lower() in ("none", "null") or any(c in v for c in ',;"')
    ):  # written so that fastdiff.core.spec reads it back as this string (see its docstring)
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(v)
