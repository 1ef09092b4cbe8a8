"""Accelerator base class, the name registry, and the declarations that order and refuse combinations.

Every accelerator is a frozen dataclass registered with ``@register``. It declares:

- ``spec_name``: the name used in text specs (``deepcache(interval=3)``);
- ``kind``: its family; kinds are applied in ``KIND_ORDER`` (weights first, compile last);
- ``touches``: what it changes (``"scheduler"``, ``"denoiser.forward"``, ``"denoiser.weights"`` ...);
- ``exclusive``: touched resources that no other accelerator may touch at the same time;
- ``conflicts_with``: names it cannot be combined with (declared on both sides; a test checks symmetry);
- ``runs_on_xla``: whether it runs on a torch-xla device (TPU); others are refused there (``check_device``).

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
import importlib
import pkgutil
import typing
from typing import Any, ClassVar

KIND_ORDER = ("compress", "attention", "cache", "guidance", "parallel", "text", "sampler", "compile")

REGISTRY: dict[str, type[Accelerator]] = {}


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
    runs_on_xla: ClassVar[bool] = False  # True only where a test ran it on torch-xla (tests/test_xla.py)
    # the changed denoiser is saved and reloaded through diffusers' from_config (new widths in its config: prune)
    rebuilt_from_config: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise AcceleratorError for values outside the allowed range. Called on construction."""

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
    if not cls.spec_name or cls.kind not in KIND_ORDER:
        raise TypeError(f"{cls.__name__} needs a spec_name and a kind in {KIND_ORDER}, got kind={cls.kind!r}")
    if cls.spec_name in REGISTRY and REGISTRY[cls.spec_name] is not cls:
        raise TypeError(
            f"accelerator name {cls.spec_name!r} is already registered by {REGISTRY[cls.spec_name]}"
        )
    REGISTRY[cls.spec_name] = cls
    return cls


FAMILIES = (
    "fastdiff.schedulers",
    "fastdiff.cache",
    "fastdiff.guidance",
    "fastdiff.compress",
    "fastdiff.distill",
    "fastdiff.parallel",
)


def _load_accelerators() -> None:
    # Importing every module of every family runs their @register decorators.
    for family in FAMILIES:
        package = importlib.import_module(family)
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{family}.{info.name}")


def available() -> list[str]:
    """Names of all registered accelerators."""
    _load_accelerators()
    return sorted(REGISTRY)


def get(name: str) -> type[Accelerator]:
    _load_accelerators()
    if name not in REGISTRY:
        raise AcceleratorError(f"unknown accelerator {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


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
