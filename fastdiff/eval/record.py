"""The one results record that ``fastdiff bench``, ``fastdiff tune`` and every benchmark script write.

A record is a JSON object: ``record`` (the format's version), ``benchmark`` (what wrote it), the run's provenance
(command, commit, date, device, threads, load; ``fastdiff.eval.provenance``), then the result's own fields. A speed
ratio carries its spread: every ``speedup`` (or ``*_speedup``) comes with ``_min`` and ``_max`` over the runs
(``fastdiff.eval.bench.ratio_spread``), or its row says how many timed ``runs`` it rests on (a tuner's screening
run). ``write_record`` refuses a record that breaks these rules, and ``python -m benchmarks.results_page --check``
applies the same ``record_problems`` to every results file that declares ``record``.

Example::

    from fastdiff.eval.record import write_record

    rows = [{"name": "dpm++2m 10", "speedup": 4.9, "speedup_min": 4.7, "speedup_max": 5.1, "fd": 4.3}]
    write_record("/tmp/example.json", {"rows": rows}, benchmark="example")
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from fastdiff.eval.provenance import PROVENANCE_KEYS, with_provenance

RECORD_VERSION = 1


class Load(TypedDict):
    start: float
    end: float


class Record(TypedDict):
    """The fields every record starts with; the result's own fields follow (any JSON)."""

    record: int
    benchmark: str
    command: str
    commit: str
    date: str
    device: str
    threads: int
    load: Load


class RecordError(ValueError):
    """A results record that breaks the format's rules (named in the message)."""


def _is_ratio(key: str, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and (key == "speedup" or key.endswith("_speedup"))


def _objects(value: Any, path: str = "$") -> Iterator[tuple[str, dict]]:
    """Every JSON object inside ``value``, with its path."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _objects(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _objects(item, f"{path}[{index}]")


def record_problems(record: Any) -> list[str]:
    """What keeps ``record`` from being a valid results record (empty when it is one)."""
    if not isinstance(record, dict):
        return ["a results record is a JSON object"]
    problems = [f"no {key!r}" for key in ("record", "benchmark", *PROVENANCE_KEYS) if key not in record]
    for path, obj in _objects(record):
        for key, value in obj.items():
            has_spread = f"{key}_min" in obj and f"{key}_max" in obj
            if _is_ratio(key, value) and not has_spread and not isinstance(obj.get("runs"), int):
                problems.append(
                    f"{path}.{key}: a speed ratio needs its spread ({key}_min and {key}_max) or the number of "
                    "timed runs it rests on ('runs')"
                )
    return problems


def make_record(result: dict, benchmark: str, max_load: float | None = None) -> dict:
    """``result`` as a record: format version, ``benchmark`` and this run's provenance added (keys the result sets
    itself, such as its own ``command``, are kept); RecordError naming each broken rule; LoadError (from
    ``with_provenance``) when the machine was busier than ``max_load``."""
    record = with_provenance({"record": RECORD_VERSION, "benchmark": benchmark, **result}, max_load)
    problems = record_problems(record)
    if problems:
        raise RecordError(f"{benchmark}: not a valid results record: " + "; ".join(problems))
    return record


def write_record(
    path: str | Path, result: dict, benchmark: str, max_load: float | None = None, indent: int = 2
) -> dict:
    """``make_record`` written to ``path`` as JSON (whole or not at all); returns the record. A record that breaks
    the rules is not written there: it goes to ``PATH.rejected`` (so a long run loses nothing) and RecordError
    names that file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        record = make_record(result, benchmark, max_load)
    except RecordError as error:
        rejected = path.with_name(path.name + ".rejected")
        rejected.write_text(json.dumps(result, indent=indent, default=str) + "\n")
        raise RecordError(f"{error} (the result is kept in {rejected})") from None
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=indent, default=str) + "\n")
    partial.replace(path)
    return record


__all__ = ["RECORD_VERSION", "Record", "RecordError", "record_problems", "make_record", "write_record"]
