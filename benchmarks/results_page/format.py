"""Number formatting and markdown tables."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# -- numbers ---------------------------------------------------------------------------------------------


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fx(v: Any, nd: int = 2) -> str | None:
    """A speedup: 2.46x."""
    return None if missing(v) else f"{v:.{nd}f}x"


def pct(v: Any, nd: int = 1) -> str | None:
    """A fraction as a percentage: 0.986 -> 98.6%."""
    return None if missing(v) else f"{100 * v:.{nd}f}%"


def db(v: Any) -> str | None:
    """PSNR; infinite means identical images."""
    if missing(v):
        return None
    return "identical" if math.isinf(v) else f"{v:.1f} dB"


def rel(v: Any) -> str | None:
    """A relative change: 0.046 -> +4.6%."""
    return None if missing(v) else f"{100 * v:+.1f}%"


def code(v: Any) -> str | None:
    return None if missing(v) or v == "" else f"`{v}`"


def spread(row: dict, key: str) -> str | None:
    """A ratio with its runs' range and verdict, where the row records them: 1.52x (1.40-1.61, level)."""
    if missing(row.get(key)):
        return None
    low, high, verdict = row.get(f"{key}_min"), row.get(f"{key}_max"), row.get(f"{key}_verdict")
    if missing(low) or missing(high):
        return fx(row[key])
    note = "" if verdict in (None, "baseline") else f", {verdict}"
    return f"{fx(row[key])} ({low:.2f}-{high:.2f}{note})"


# -- tables ----------------------------------------------------------------------------------------------


def table(columns: list[tuple[str, Callable[[Any], Any]]], items: list[Any]) -> str:
    """A markdown table; a column whose every cell is empty is dropped."""
    cells = [[fn(item) for _, fn in columns] for item in items]
    keep = [j for j in range(len(columns)) if any(row[j] not in (None, "") for row in cells)]
    head = "| " + " | ".join(columns[j][0] for j in keep) + " |"
    rule = "|" + "---|" * len(keep)
    body = ["| " + " | ".join("-" if row[j] in (None, "") else str(row[j]) for j in keep) + " |" for row in cells]
    return "\n".join([head, rule, *body])


def find(items: list[dict], key: str, value: str) -> dict:
    return next(i for i in items if i.get(key) == value)
