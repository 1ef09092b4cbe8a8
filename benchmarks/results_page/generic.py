"""One renderer for every results file: tables from its rows, formats from its field names.

A results file is a JSON object. Its top-level scalars become one line of settings; a list of objects (rows,
the shape ``fastdiff.eval.bench.run_bench`` and most scripts write) becomes a table; an object whose values are
all objects becomes a table with a ``name`` column, or, when they nest deeper, one titled part each. A field's
name says how it is shown, never the file: ``speedup`` with ``speedup_min``/``speedup_max`` (and a verdict) is a
ratio with its runs' range, ``fd_ratio`` with ``_low``/``_high`` an interval, ``accuracy`` a percentage,
``psnr`` decibels, ``specs`` code. Provenance fields are shown once, above the tables, by ``pages``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .format import code, db, missing, pct, table

PROVENANCE = set(
    "command commit date device load threads build_command eval_command commands record machine setup measure build "
    "benchmark note notes".split()
)
SUFFIXES = ("_min", "_max", "_verdict", "_low", "_high", "_rounds")
MAX_ROWS = 30  # a longer list is cut, saying how many rows the file holds
MAX_DEPTH = 3
PERCENT = ("accuracy", "direction_accuracy", "digit_accuracy", "hit_rate", "skipped_fraction")


def scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def show(key: str, v: Any, row: dict | None = None) -> str | None:
    """A value by its field's name (and, for ranges, its sibling fields in ``row``)."""
    if missing(v):
        return None
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return code(v) if key in ("specs", "spec", "accelerators", "config_spec") or "(" in v and len(v) < 120 else v
    if isinstance(v, list):
        return summary(v)
    if not isinstance(v, (int, float)):
        return str(v)
    row = row or {}
    low, high = row.get(f"{key}_min", row.get(f"{key}_low")), row.get(f"{key}_max", row.get(f"{key}_high"))
    if key.startswith("psnr"):
        return db(v)
    if key in PERCENT and isinstance(v, float) and 0 <= v <= 1:
        return pct(v)
    text = number(v)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        verdict = row.get(f"{key}_verdict")
        note = f", {verdict}" if verdict not in (None, "baseline") else ""
        bracket = "[{}, {}]" if f"{key}_low" in row else "({}-{}{})"
        text += " " + bracket.format(number(low), number(high), note)
    if "speedup" in key or key.endswith("_ratio"):
        text = text.replace(" ", "x ", 1) if " " in text else text + "x"
    return text


def number(v: float | int) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf"
    magnitude = abs(v)
    if magnitude >= 100:
        return f"{v:.1f}"
    if magnitude >= 0.01 or v == 0:
        return f"{v:.3g}" if magnitude < 1 else f"{v:.2f}"
    return f"{v:.2e}"


def summary(values: list) -> str:
    """A short list in full, a long one as its count and range."""
    if all(scalar(x) for x in values) and len(values) <= 8:
        return ", ".join(show("", x) or "-" for x in values)
    numbers = [x for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if numbers and len(numbers) == len(values):
        return f"{len(values)} values, {number(min(numbers))} to {number(max(numbers))}"
    return f"{len(values)} items"


def columns(rows: list[dict]) -> list[str]:
    """Fields shown as columns: each once, in order of first appearance, range siblings folded into their field."""
    seen: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            base = next((key[: -len(s)] for s in SUFFIXES if key.endswith(s) and key[: -len(s)] in row), key)
            if base == key and (scalar(value) or isinstance(value, list)):
                seen.setdefault(key)
    return list(seen)


def flat(row: dict) -> dict:
    """A row with its objects of scalars (``vs_dpm: {speedup: ...}``) as fields of their own (``vs_dpm.speedup``)."""
    out: dict = {}
    for key, value in row.items():
        if isinstance(value, dict) and value and all(scalar(x) or plain_list(x) for x in value.values()):
            out.update({f"{key}.{k}": x for k, x in value.items()})
        else:
            out[key] = value
    return out


def cell(key: str, row: dict) -> str | None:
    return show(key, row.get(key), row)


def rows_table(rows: list[dict], name: str | None = None) -> str:
    """Rows (objects) as a table; ``name`` puts each row's key (an object of rows) in the first column."""
    cut = [flat(r) for r in rows[:MAX_ROWS]]
    keys = columns(cut)
    spec = [(k.replace("_", " "), functools.partial(cell, k)) for k in keys if k != "__name__"]
    if name:
        spec.insert(0, (name, lambda r: r.get("__name__")))
    text = table(spec, cut)
    if len(rows) > len(cut):
        text += f"\n\n({len(rows) - len(cut)} more rows in the file.)"
    return text


def nested(d: dict) -> list[tuple[str, Any]]:
    """The fields of ``d`` that are not shown as one line of settings."""
    return [(k, v) for k, v in d.items() if k not in PROVENANCE and not scalar(v) and not plain_list(v)]


def plain_list(v: Any) -> bool:
    return isinstance(v, list) and all(scalar(x) for x in v)


def settings_line(d: dict) -> str:
    items = [(k, v) for k, v in d.items() if k not in PROVENANCE and (scalar(v) or plain_list(v))]
    items = [(k, show(k, v, d)) for k, v in items if not any(k.endswith(s) and k[: -len(s)] in d for s in SUFFIXES)]
    return "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in items if v not in (None, ""))


def render(d: Any, depth: int = 0) -> str:
    """Markdown for a results value: settings, then a table or a titled part per nested field."""
    if isinstance(d, list):
        if all(isinstance(x, dict) for x in d) and d:
            return rows_table(d)
        return summary(d)
    if not isinstance(d, dict):
        return show("", d) or "-"
    parts = []
    line = settings_line(d)
    if line:
        parts.append(line + ".")
    for key, value in nested(d):
        title = f"**{key.replace('_', ' ')}**"
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            inner = sorted({k for x in value for k, _ in nested(flat(x))})
            note = f"\n\n(Each row also holds {', '.join(inner)}: see the file.)" if inner else ""
            parts.append(f"{title}\n\n{rows_table(value)}{note}")
        elif isinstance(value, dict) and value and all(isinstance(x, dict) for x in value.values()):
            if all(not nested(flat(x)) for x in value.values()) or depth >= 1:
                named = [{"__name__": k, **x} for k, x in value.items()]
                inner = sorted({k for x in named for k, _ in nested(flat(x))})
                note = f"\n\n(Each row also holds {', '.join(inner)}: see the file.)" if inner else ""
                parts.append(f"{title}\n\n{rows_table(named, name='name')}{note}")
            else:
                parts += [f"{title}: {k}\n\n{render(x, depth + 1)}" for k, x in value.items()]
        elif depth < MAX_DEPTH:
            body = render(value, depth + 1)
            if body:
                parts.append(f"{title}\n\n{body}")
        else:
            parts.append(f"{title}: {summary(value) if isinstance(value, list) else f'{len(value)} fields'}")
    return "\n\n".join(p for p in parts if p)
