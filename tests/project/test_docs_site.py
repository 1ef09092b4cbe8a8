"""The documentation: README.md as a short front page, docs/ as guides, generated results, the mkdocs site.

- ``python -m benchmarks.results_page --check`` passes: docs/results.md and every generated block (README's
  accelerator table, the measured tables in the guides) say what ``benchmarks/results/*.json`` says;
- the check fails, naming the page, when a generated part is edited by hand;
- README.md stays a front page (at most 250 lines);
- the product's text (README, docs, comments and strings in code, tests, benchmarks, notebooks) describes the
  product, not the history of its making (``FORBIDDEN``: no work periods, no tracker numbers). Objects such as
  ``requests.Session``, ``onnxruntime.InferenceSession`` or pytest's ``request.session`` are code, not history;
- ``mkdocs build --strict`` passes (slow; skipped when mkdocs is not installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250

# Where the product's text lives, and which of its files are text.
SCANNED = ["README.md", "docs", "fastdiff", "tests", "benchmarks", "notebooks"]
TEXT_SUFFIXES = {".md", ".py", ".json", ".jsonl", ".ipynb", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg"}
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints"}

FORBIDDEN = re.compile(r"\bsessions?\b|\bissue\s*#?\s*\d+|\bwork items?\b", re.IGNORECASE)
# The word as code, not history: an attribute or class after a dot (request.session, requests.Session), or an
# object used (x.run(...)), called (X(...)) or assigned (x = ...).
# ("[s]" keeps the pattern from matching itself.)
SESSION_OBJECT = re.compile(r"(?<=\.)[s]essions?\b|\b[s]essions?(?=\.\w|\(|\s*=(?!=))", re.IGNORECASE)

# an accelerator config class: ``@register`` (then perhaps other decorators) before ``class Name``
REGISTERED_CLASS = re.compile(r"^@register\n(?:@.*\n)*class (\w+)", re.MULTILINE)


@pytest.fixture
def rp(monkeypatch):
    """The results-page package, imported from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("benchmarks.results_page.__main__")


def results_check() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.results_page", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_results_pages_match_the_json():
    proc = results_check()
    assert proc.returncode == 0, f"stale generated docs (run python -m benchmarks.results_page):\n{proc.stderr}"


def test_check_names_a_page_edited_by_hand(tmp_path, monkeypatch, capsys, rp):
    pages = rp.pages
    readme, docs = tmp_path / "README.md", tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    text = README.read_text()
    assert "<!-- results:begin accelerators -->" in text, "README.md lost its generated accelerator table"
    readme.write_text(
        text.replace("<!-- results:begin accelerators -->\n", "<!-- results:begin accelerators -->\n| x |\n", 1)
    )
    monkeypatch.setattr(pages, "README", readme)
    monkeypatch.setattr(pages, "DOCS", docs)
    monkeypatch.setattr(pages, "RESULTS_PAGE", docs / "results.md")
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    assert rp.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "README.md" in err and "docs/results.md" not in err

    (docs / "results.md").write_text((docs / "results.md").read_text().replace("| 98.6% |", "| 99.9% |", 1))
    assert rp.main(["--check"]) == 1
    assert "docs/results.md" in capsys.readouterr().err

    assert rp.main([]) == 0  # regenerates both
    capsys.readouterr()
    assert rp.main(["--check"]) == 0


def test_check_refuses_a_results_file_without_provenance(tmp_path, monkeypatch, capsys, rp):
    pages = rp.pages
    full = {
        "command": "fastdiff bench digits",
        "commit": "abc",
        "date": "2026-12-05",
        "device": "cpu",
        "load": {"start": 0.1, "end": 0.2},
    }
    legacy = tmp_path / "legacy.txt"
    legacy.write_text("# header\nold\n")
    monkeypatch.setattr(pages, "LEGACY", legacy)
    assert pages.provenance_errors({"old": {"rows": []}, "new": full}) == []
    errors = pages.provenance_errors({"old": {"rows": []}, "new": {k: v for k, v in full.items() if k != "load"}})
    assert errors == ["benchmarks/results/new.json records no load: re-run its command"]
    errors = pages.provenance_errors({"old": full})  # re-run with provenance: it must leave the legacy list
    assert errors == ["benchmarks/results/old.json has full provenance now: remove it from legacy.txt"]
    assert pages.provenance_errors({}) == ["legacy.txt lists old, which has no results file"]
    monkeypatch.setattr(pages, "load_results", lambda: {"new": {"rows": []}})
    assert pages.check({}) == 1
    assert "new.json records no command, commit, date, device, load" in capsys.readouterr().err
    assert "Commit: `abc`. Load average: 0.1 at the start, 0.2 at the end." in pages.provenance("new", full)[-1]


def test_check_applies_the_record_rules_to_files_written_as_records(tmp_path, monkeypatch, rp):
    pages = rp.pages
    monkeypatch.setattr(pages, "LEGACY", tmp_path / "legacy.txt")
    (tmp_path / "legacy.txt").write_text("# header\n")
    record = {
        "record": 1,
        "benchmark": "x",
        "command": "python x.py",
        "commit": "abc",
        "date": "2026-12-05",
        "device": "cpu",
        "load": {"start": 0.1, "end": 0.2},
    }
    good = {
        **record,
        "rows": [{"speedup": 2.0, "speedup_min": 1.9, "speedup_max": 2.1}, {"speedup": 3.0, "runs": 1}],
    }
    assert pages.provenance_errors({"good": good}) == []
    bad = {**record, "rows": [{"name": "a", "cpu_speedup": 2.0}]}
    (error,) = pages.provenance_errors({"bad": bad})
    assert error.startswith("benchmarks/results/bad.json: $.rows[0].cpu_speedup: a speed ratio needs its spread")


def test_every_results_file_has_a_described_section(rp):
    sections = rp.pages.SECTIONS
    stems = {p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json")}
    assert stems, "no results files"
    assert not stems - set(sections), (
        f"results files without a section in benchmarks/results_page: {sorted(stems - set(sections))}"
    )
    assert not set(sections) - stems, f"sections without a results file: {sorted(set(sections) - stems)}"


def test_an_erratum_shows_in_place_of_the_field_it_names(monkeypatch, rp):
    pages = rp.pages
    section = pages.SECTIONS["flow_caching_first_block"]
    monkeypatch.setitem(pages.SECTIONS, "x", section)
    d = {"model": "m", "mag_ratios": {"speedup": 1.87, "speedup_min": 1.8, "speedup_max": 1.9}}
    page = pages.render_file("x", d)
    assert f"mag ratios: {section.errata['mag_ratios']} (erratum)" in page and "1.87" not in page
    assert d["mag_ratios"]["speedup"] == 1.87  # the record itself is left as written
    assert "1.87" in pages.render_file("flow_caching", {"speedup": 1.87})  # a field without an erratum


def test_results_page_modules_stay_small():
    for module in sorted((ROOT / "benchmarks" / "results_page").glob("*.py")):
        lines = len(module.read_text().splitlines())
        assert lines <= 400, f"{module.relative_to(ROOT)} has {lines} lines; split it (at most 400)"


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into docs/ (at most {README_MAX_LINES})"
    )
    text = "\n".join(lines)
    for needed in (
        "make demo",
        "make test",
        "## Install",
        "<!-- results:begin accelerators -->",
        "docs/results.md",
    ):
        assert needed in text, f"README.md lacks {needed!r}"


def forbidden_in(line: str) -> bool:
    return any(not SESSION_OBJECT.match(line, m.start()) for m in FORBIDDEN.finditer(line))


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a file's prose: every line, or a Python file's comments and strings."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    out = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING) or token.type == getattr(
                tokenize, "FSTRING_MIDDLE", -1
            ):
                out += [(token.start[0] + i, line) for i, line in enumerate(token.string.splitlines())]
    except (tokenize.TokenError, SyntaxError):
        return list(enumerate(text.splitlines(), 1))
    return out


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [
            p for p in candidates if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIPPED_DIRS & set(p.parts)
        ]
    return files


def test_the_forbidden_words_check_is_precise():
    s, i = "sess" + "ion", "iss" + "ue"  # spelled in pieces: this file passes its own check and a plain grep
    for history in (
        f"Measured in the second {s}.",
        f"{s.title()}s 3 and 4 tuned it",
        f"as {i} 12 asks",
        f"see {i} #7",
        f"left for the next work {s}",
    ):
        assert forbidden_in(history), history
    for code in (
        f"client = requests.{s.title()}()",
        f"{s} = ort.Inference{s.title()}(path)",
        f"got = {s}.run(None, feed)",
        f"selected = {{item.name for item in request.{s}.items}}",
        f"async with aiohttp.Client{s.title()}() as http:",
        "this issues 3 requests",
    ):
        assert not forbidden_in(code), code


def test_no_work_sessions_or_issue_numbers():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for path in scanned_files()
        for n, line in prose(path)
        if forbidden_in(line)
    ]
    assert not found, "the text describes the product, not the history of its making:\n" + "\n".join(found)


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    needed = {
        "mkdocs": "mkdocs",
        "material": "mkdocs-material",
        "mkdocstrings_handlers": "mkdocstrings-python",
    }
    missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"the docs site is not built: {', '.join(missing)} not installed (pip install -e '.[docs]')")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    site = tmp_path / "site"
    assert (site / "results" / "index.html").is_file()

    # the API reference documents the public entry points and every registered accelerator config (found in
    # the source: importing fastdiff would cost this test more than the build)
    def anchors(page: str) -> set[str]:
        return set(re.findall(r'id="(fastdiff\.[\w.]+)"', (site / "api" / page / "index.html").read_text()))

    registered = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts) + "." + name
        for path in sorted((ROOT / "fastdiff").rglob("*.py"))
        for name in REGISTERED_CLASS.findall(path.read_text())
    ]
    assert len(registered) >= 20, registered
    for page, needed in {
        "core": ["fastdiff.core.pipeline.FastPipeline", "fastdiff.core.pipeline.FastPipeline.accelerate"],
        "accelerators": registered,
        "bench": ["fastdiff.eval.bench.run_bench"],
        "tune": ["fastdiff.tune.search.tune"],
        "serving": ["fastdiff.serving.engine.Engine", "fastdiff.serving.app.serve"],
    }.items():
        lacking = sorted(set(needed) - anchors(page))
        assert not lacking, f"docs/api/{page}.md does not document {lacking}"
