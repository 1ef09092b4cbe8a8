"""Where a figure came from: the command, commit, date, device, threads and machine load of a run.

Every results file carries this record (``python -m benchmarks.results_page --check`` refuses files without it),
and a timing taken on a busy machine is refused rather than recorded: ``check_load`` raises when the load average,
less the run's own threads, is above the limit the benchmark names (its ``--max-load``, or ``FASTDIFF_MAX_LOAD``
for every script: ``with_provenance`` then refuses to return a record whose run started or ended above it).

Example::

    from fastdiff.eval.provenance import check_load, provenance

    check_load(max_load=0.5)          # raises LoadError on a busy machine
    record = provenance()             # {"command": ..., "commit": ..., "date": ..., "device": ..., "load": ...}
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

PROVENANCE_KEYS = ("command", "commit", "date", "device", "load")
MAX_LOAD_ENV = "FASTDIFF_MAX_LOAD"  # the load limit of scripts that name none themselves


class LoadError(RuntimeError):
    """The machine is busier than a benchmark allows: its timings would not compare."""


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def env_max_load() -> float | None:
    """``FASTDIFF_MAX_LOAD`` as a number (None when unset); ValueError naming a value that is not one."""
    raw = os.environ.get(MAX_LOAD_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{MAX_LOAD_ENV} must be a number >= 0, got {raw!r}") from None
    if not value >= 0:
        raise ValueError(f"{MAX_LOAD_ENV} must be a number >= 0, got {raw!r}")
    return value


def check_load(max_load: float | None, own_threads: int = 0, load: float | None = None) -> float:
    """The load average now (or ``load``); ``LoadError`` when it exceeds ``max_load`` (default
    ``FASTDIFF_MAX_LOAD``) plus the run's ``own_threads``."""
    load = load_average() if load is None else load
    limit = max_load if max_load is not None else env_max_load()
    if limit is not None and load - own_threads > limit:
        raise LoadError(
            f"load average {load:.2f} (less this run's {own_threads} threads: {load - own_threads:.2f}) is above "
            f"max_load {limit}: other work is running, so timings would not compare; wait or raise --max-load "
            f"({MAX_LOAD_ENV})"
        )
    return load


def command_line() -> str:
    """The command that started this process, as typed (``python -m ...`` or the console script's name)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if len(argv) > 1 and Path(argv[0]).name.startswith("python") and _console_script(argv[1]):
        argv = argv[1:]  # python /venv/bin/fastdiff ...: the console script, as typed
    if argv and Path(argv[0]).name.startswith("python"):
        argv[0] = "python"
    elif argv:
        argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def _console_script(path: str) -> bool:
    """``path`` is an installed console script (a file in a ``bin`` or ``Scripts`` folder, not a ``.py`` file)."""
    file = Path(path)
    return file.suffix != ".py" and file.parent.name in ("bin", "Scripts") and file.is_file()


def git_commit(directory: str | Path | None = None) -> str:
    """HEAD of the checkout holding this package (``-dirty`` when tracked files other than the results under
    ``benchmarks/results`` differ: a run that rewrites an earlier run's results file still ran clean code);
    "unknown" outside git."""
    where = str(directory or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(exclude,top)benchmarks/results",
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


def device_name() -> str:
    """The GPU's name when CUDA is in use, else the CPU's model and core count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores (CPU)"


def provenance(command: str | None = None, load_start: float | None = None) -> dict:
    """The provenance record of a run finishing now; ``load_start``: the load average when it began."""
    end = load_average()
    return {
        "command": command or command_line(),
        "commit": git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(),
        "threads": torch.get_num_threads(),
        "load": {"start": round(load_start if load_start is not None else end, 2), "end": round(end, 2)},
    }


_LOAD_AT_IMPORT = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # a script's load when it started


def with_provenance(result, max_load: float | None = None):
    """``result`` (a results dict) with the provenance of this process added; keys the result sets itself (its own
    ``command``, ``device`` or ``date``) are kept. Non-dict results are returned unchanged. ``LoadError`` instead
    when the load when the process started or now, less its threads, is above ``max_load`` (default
    ``FASTDIFF_MAX_LOAD``): a figure timed on a busy machine is not recorded."""
    if not isinstance(result, dict):
        return result
    record = provenance(load_start=_LOAD_AT_IMPORT)
    for load in record["load"].values():
        check_load(max_load, own_threads=record["threads"], load=load)
    return {**record, **result}


__all__ = [
    "PROVENANCE_KEYS",
    "MAX_LOAD_ENV",
    "LoadError",
    "load_average",
    "env_max_load",
    "check_load",
    "command_line",
    "git_commit",
    "device_name",
    "provenance",
    "with_provenance",
]
