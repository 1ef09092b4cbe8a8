"""What a results file is: its group on the results page, title, script and one-line description."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Section:
    group: str
    title: str
    script: str
    what: str
    render: Callable[[Any], str]


GROUPS = [
    "Samplers and the yardstick",
    "Caching and step reuse",
    "Guidance",
    "Compression",
    "Distillation",
    "Tuning",
    "Flow-matching models",
    "Video models",
    "Several processes and devices",
    "Serving",
    "Overhead and compatibility",
    "Real model sizes on a GPU",
]
