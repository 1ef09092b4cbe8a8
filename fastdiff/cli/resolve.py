"""What the ``fastdiff`` commands share: where zoo models are cached, model names to directories, config lists.

Every command module imports these from here (``fastdiff.cli.main`` sits above the command modules).

Example::

    from fastdiff.cli.resolve import resolve_model
    path = resolve_model("digits")   # the shipped digits model, copied into $FASTDIFF_CACHE (hash-checked)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """Where zoo models named on the command line are built: $FASTDIFF_CACHE or ~/.cache/fastdiff."""
    return Path(os.environ.get("FASTDIFF_CACHE", Path.home() / ".cache" / "fastdiff"))


def resolve_model(model: str, size: str = "bench") -> Path:
    """A pipeline directory, or a zoo name built (once) into the cache."""
    try:
        path = Path(model).expanduser()
        exists = path.exists()
    except (RuntimeError, OSError, ValueError):  # ~unknown-user, a name too long for the file system
        exists = False
    if exists:
        return path
    from fastdiff import zoo

    if model not in zoo.available():
        raise SystemExit(f"error: {model!r} is neither a directory nor a zoo model ({', '.join(zoo.available())})")
    target = cache_dir() / f"{model}-{size}"
    from fastdiff.zoo.shipped import install, is_installed, shipped_models

    if size == "bench" and model in shipped_models():
        if not is_installed(target, model):  # first use, or a stale/damaged copy: the shipped files, checked
            install(target, model)
        return target
    if not (target / "model_index.json").is_file():
        print(f"building zoo model {model} ({size}) into {target} ...", file=sys.stderr)
        zoo.build(model, target, size=size)
    return target


def parse_configs(items: list[str]) -> list[tuple[str, str]]:
    """``NAME=SPECS`` items of ``--config``/``--compare`` as (name, specs) pairs."""
    configs = []
    for item in items:
        name, sep, specs = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"error: --config expects NAME=SPECS, got {item!r}")
        configs.append((name.strip(), specs))
    return configs
