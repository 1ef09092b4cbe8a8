"""Plugins by entry point: the modules that register accelerators or evaluators, named in pyproject.toml only.

``fastdiff.accelerators`` lists the accelerator families (packages whose every module is imported, running their
``@register`` decorators); ``fastdiff.quality`` the modules that register quality evaluators (the references').
So the core and the evaluation layer name no family and no reference model. Another distribution can add its own
entries to either group.

A source tree run without installing (``PYTHONPATH=.``, as benchmarks/gpu.sh does) has no package metadata; the
groups are then read from the tree's own pyproject.toml.

Example::

    from fastdiff.core.plugins import plugin_modules

    plugin_modules("fastdiff.quality")  # ['fastdiff.zoo.evaluators']
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from pathlib import Path

ACCELERATORS = "fastdiff.accelerators"
QUALITY = "fastdiff.quality"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # present in a source tree only


def plugin_modules(group: str) -> list[str]:
    """The module names of ``group``'s entry points, sorted (installed metadata, else the source tree's pyproject)."""
    found = sorted({entry.module for entry in entry_points(group=group)})
    if found or not PYPROJECT.is_file():
        return found
    return _pyproject_entries(PYPROJECT.read_text(), group)


def _pyproject_entries(text: str, group: str) -> list[str]:
    # Own reader of one `name = "module"` table: tomllib is Python 3.11+, and fastdiff supports 3.10.
    header, modules, inside = f'[project.entry-points."{group}"]', [], False
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            inside = line == header
        elif inside and "=" in line:
            modules.append(line.split("=", 1)[1].strip().strip("\"'").split(":")[0])
    return sorted(set(modules))


# Groups already imported: reading every distribution's metadata costs ~17 ms, and the registry asks on every lookup
_LOADED: dict[tuple[str, bool], list[str]] = {}


def load_plugins(group: str, packages: bool = False) -> list[str]:
    """Import ``group``'s modules (with ``packages``: every module of each package) once; return their names."""
    key = (group, packages)
    if key in _LOADED:
        return list(_LOADED[key])
    names = plugin_modules(group)
    for name in names:
        module = importlib.import_module(name)
        if packages:
            for info in pkgutil.iter_modules(module.__path__):
                importlib.import_module(f"{name}.{info.name}")
    _LOADED[key] = names
    return list(names)
