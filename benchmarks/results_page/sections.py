"""What each results file is (``sections.json``): its group on the results page, title, script, description and
errata; and the page's opening paragraphs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Section:
    group: str
    title: str
    script: str
    what: str
    # field -> what to show instead: a field a script recorded wrongly (the file stays as its run wrote it)
    errata: dict[str, str] = field(default_factory=dict)


_DATA = json.loads((Path(__file__).with_name("sections.json")).read_text())
INTRO: list[str] = _DATA["intro"]  # the results page's opening paragraphs
GROUPS: list[str] = _DATA["groups"]
SECTIONS: dict[str, Section] = {stem: Section(**entry) for stem, entry in _DATA["files"].items()}
