"""Where the pages are, what each page should say (provenance, sections, blocks), and the check."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from fastdiff.eval.record import record_problems

from . import charts
from .generic import render
from .headlines import accelerators_block
from .real_sizes import real_sizes_block
from .sections import GROUPS, INTRO, SECTIONS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- results:begin ([\w.+-]+) -->\n)(.*?)(<!-- results:end -->)", re.S)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


# -- provenance ------------------------------------------------------------------------------------------


# keys under which results files record the commands that wrote them, and how the page labels each
COMMAND_KEYS = [("command", "Command"), ("build_command", "Build"), ("eval_command", "Evaluate")]
COMMAND_KEYS += [("build", "Build"), ("measure", "Measure")]


def command_of(d: Any) -> list[tuple[str, str]]:
    """The commands a results file records, as (label, command)."""
    if not isinstance(d, dict):
        return []
    out = []
    for key, label in COMMAND_KEYS:
        value = d.get(key)
        if isinstance(value, str):
            out.append((label, value))
        elif isinstance(value, dict) and isinstance(value.get("command"), str):
            out.append((label, value["command"]))
    for value in d.get("commands", []) if isinstance(d.get("commands"), list) else []:
        out.append(("Command", value))
    return out


def device_of(d: Any) -> str | None:
    if not isinstance(d, dict):
        return None
    for key in ("device", "machine"):
        value = d.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            return ", ".join(f"{k} {v}" for k, v in value.items() if k != "started")
    if isinstance(d.get("setup"), dict):
        s = d["setup"]
        return f"{s.get('cpus')} CPUs, {s.get('machine')}, PJRT_DEVICE={s.get('PJRT_DEVICE')}"
    return None


def date_of(d: Any) -> str | None:
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("date"), str):
        return d["date"]
    machine = d.get("machine")
    if isinstance(machine, dict) and machine.get("started"):
        return str(machine["started"])
    for key in ("machine", "note", "conditions"):
        if isinstance(d.get(key), str) and DATE.search(d[key]):
            return DATE.search(d[key]).group(0)
    return None


def threads_of(d: Any) -> Any:
    if not isinstance(d, dict):
        return None
    for src in (d, d.get("settings") if isinstance(d.get("settings"), dict) else {}):
        if "threads" in src:
            return src["threads"]
    return None


LEGACY = RESULTS / "legacy_provenance.txt"


def legacy_stems() -> set[str]:
    """Files written before results carried a commit and the load: each leaves the list when its command re-runs."""
    if not LEGACY.is_file():
        return set()
    return {line.strip() for line in LEGACY.read_text().splitlines() if line.strip() and not line.startswith("#")}


def missing_provenance(d: Any) -> list[str]:
    """The provenance keys (command, commit, date, device, load) a results file lacks."""
    found = {
        "command": bool(command_of(d)),
        "commit": isinstance(d, dict) and isinstance(d.get("commit"), str),
        "date": date_of(d) is not None,
        "device": device_of(d) is not None,
        "load": isinstance(d, dict) and isinstance(d.get("load"), dict),
    }
    return [key for key, ok in found.items() if not ok]


def provenance_errors(results: dict[str, Any]) -> list[str]:
    """A file outside the legacy list without full provenance, and a legacy-listed file that now has it."""
    legacy, errors = legacy_stems(), []
    for stem, d in results.items():
        missing = missing_provenance(d)
        if missing and stem not in legacy:
            errors.append(f"benchmarks/results/{stem}.json records no {', '.join(missing)}: re-run its command")
        elif not missing and stem in legacy:
            errors.append(f"benchmarks/results/{stem}.json has full provenance now: remove it from {LEGACY.name}")
    errors += [f"{LEGACY.name} lists {stem}, which has no results file" for stem in sorted(legacy - set(results))]
    for stem, d in results.items():  # files written as results records keep the record's rules
        if isinstance(d, dict) and "record" in d:
            errors += [f"benchmarks/results/{stem}.json: {problem}" for problem in record_problems(d)]
    return errors


def load_results() -> dict[str, Any]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


def provenance(stem: str, d: Any) -> list[str]:
    """The lines under a section title: file, command (or its absence), device, date."""
    section = SECTIONS.get(stem)
    lines = [f"File: `benchmarks/results/{stem}.json`."]
    commands = command_of(d)
    if commands:
        lines += [f"{label}: `{cmd}`" for label, cmd in commands]
    else:
        script = f" (written by {section.script})" if section else ""
        lines.append(f"Command: not recorded in the file{script}.")
    bits = []
    device = device_of(d)
    if device:
        bits.append(f"Device: {device}")
    threads = threads_of(d)
    if threads is not None and not (device and "thread" in device):
        bits.append(f"torch threads: {threads}")
    date = date_of(d)
    bits.append(f"Date: {date}" if date else "Date: not recorded")
    if isinstance(d, dict) and isinstance(d.get("commit"), str) and isinstance(d.get("load"), dict):
        load = d["load"]
        bits.append(
            f"Commit: `{d['commit'][:12]}`. Load average: {load.get('start')} at the start, {load.get('end')} at the end"
        )
    else:
        bits.append("Commit and load: not recorded (written before results carried them)")
    lines.append(". ".join(bits) + ".")
    return lines


# -- the results page ------------------------------------------------------------------------------------


def render_file(stem: str, d: Any) -> str:
    errata = SECTIONS[stem].errata if stem in SECTIONS else {}
    if errata and isinstance(d, dict):
        d = {**d, **{key: f"{note} (erratum)" for key, note in errata.items() if key in d}}
    try:
        return render(d)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        raise SystemExit(
            f"results_page: cannot render benchmarks/results/{stem}.json: {type(error).__name__}: {error}"
        ) from error


def results_page(results: dict[str, Any]) -> str:
    out = [
        "# Measured results",
        "",
        "<!-- Generated by `python -m benchmarks.results_page` from `benchmarks/results/*.json`; do not edit by hand."
        " `python -m benchmarks.results_page --check` fails when this page and the JSON differ. -->",
        "",
        *INTRO,
        "",
        charts.markdown("", results),
        "",
    ]
    by_group: dict[str, list[str]] = {g: [] for g in GROUPS}
    by_group["Other results"] = []
    for stem in results:
        by_group[SECTIONS[stem].group if stem in SECTIONS else "Other results"].append(stem)
    order = {stem: i for i, stem in enumerate(SECTIONS)}
    for group, stems in by_group.items():
        if not stems:
            continue
        out += [f"## {group}", ""]
        for stem in sorted(stems, key=lambda s: order.get(s, len(order))):
            d = results[stem]
            section = SECTIONS.get(stem)
            out += [f"### {section.title if section else stem}", ""]
            if section:
                out += [section.what, ""]
            prov = provenance(stem, d)
            out += [line + "  " for line in prov[:-1]] + [prov[-1]]
            out += ["", render_file(stem, d), ""]
    return "\n".join(out).rstrip() + "\n"


# -- blocks in pages -------------------------------------------------------------------------------------


def block_body(name: str, results: dict[str, Any], page: Path) -> str:
    if name == "accelerators":
        prefix = "docs/" if page.parent == ROOT else ""
        return accelerators_block(results, prefix) + "\n"
    if name == "charts":
        return charts.markdown("docs/" if page.parent == ROOT else "", results) + "\n"
    if name == "real-sizes":
        return real_sizes_block(results) + "\n"
    if name not in results:
        raise SystemExit(
            f"results_page: {page.relative_to(ROOT)} has a block for {name!r}, but benchmarks/results/{name}.json does not exist"
        )
    prov = provenance(name, results[name])
    prov = [line + "  " for line in prov[:-1]] + [prov[-1]]
    return "\n".join(prov) + "\n\n" + render_file(name, results[name]) + "\n"


def refresh_blocks(text: str, results: dict[str, Any], page: Path) -> str:
    def sub(m):
        return m.group(1) + block_body(m.group(2), results, page) + m.group(4)

    return BLOCK.sub(sub, text)


def pages_with_blocks() -> list[Path]:
    pages = [README] + sorted(p for p in DOCS.rglob("*.md") if p != RESULTS_PAGE)
    return [p for p in pages if p.is_file() and "<!-- results:begin" in p.read_text()]


def expected() -> dict[Path, str]:
    results = load_results()
    out = {RESULTS_PAGE: results_page(results), **charts.expected(results, DOCS)}
    for page in pages_with_blocks():
        out[page] = refresh_blocks(page.read_text(), results, page)
    return out


def check(pages: dict[Path, str]) -> int:
    """1, naming each page on stderr, when a page on disk differs from what the JSON says or a results file lacks
    its provenance (:func:`provenance_errors`); else 0."""
    errors = provenance_errors(load_results())
    for error in errors:
        print(error, file=sys.stderr)
    stale = [
        p
        for p, text in pages.items()
        if not p.is_file() or p.read_text() != text and (p.suffix != ".svg" or charts.comparable(p.read_text()))
    ]
    for p in stale:
        print(
            f"{p.relative_to(ROOT)}: differs from benchmarks/results/*.json; run python -m benchmarks.results_page",
            file=sys.stderr,
        )
    return 1 if stale or errors else 0


def write(pages: dict[Path, str]) -> int:
    """Write each page that differs from what the JSON says."""
    for p, text in pages.items():
        if not p.is_file() or p.read_text() != text:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            print(f"wrote {p.relative_to(ROOT)}")
    return 0
