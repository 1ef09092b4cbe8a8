"""Results records: provenance added, a ratio without its spread refused (the result kept), every writer uses it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fastdiff.eval.record import RECORD_VERSION, RecordError, record_problems, write_record

ROOT = Path(__file__).resolve().parents[2]


def test_write_record_adds_version_benchmark_and_provenance(tmp_path):
    rows = [{"name": "a", "speedup": 2.0, "speedup_min": 1.8, "speedup_max": 2.2}]
    written = write_record(tmp_path / "r.json", {"rows": rows, "command": "python own.py"}, benchmark="demo")
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk == written
    assert on_disk["record"] == RECORD_VERSION and on_disk["benchmark"] == "demo"
    assert on_disk["command"] == "python own.py"  # the result's own command is kept
    assert {"commit", "date", "device", "threads", "load"} <= set(on_disk)
    assert record_problems(on_disk) == []
    assert not list(tmp_path.glob("*.partial"))


def test_a_ratio_without_spread_is_refused_and_the_result_kept(tmp_path):
    result = {
        "configs": [
            {"name": "a", "speedup": 1.0, "speedup_min": 1.0, "speedup_max": 1.0},
            {"name": "b", "cpu_speedup": 2.5},
        ]
    }
    with pytest.raises(RecordError, match=r"\$\.configs\[1\]\.cpu_speedup: a speed ratio needs its spread") as error:
        write_record(tmp_path / "r.json", result, benchmark="demo")
    assert "r.json.rejected" in str(error.value)
    assert not (tmp_path / "r.json").exists()
    assert json.loads((tmp_path / "r.json.rejected").read_text()) == result
    # one timed run, said as such, is accepted: the reader sees it rests on one run
    result["configs"][1]["runs"] = 1
    write_record(tmp_path / "r.json", result, benchmark="demo")


def test_record_problems_names_missing_provenance():
    assert record_problems([1]) == ["a results record is a JSON object"]
    problems = record_problems({"benchmark": "x", "rows": []})
    assert problems == ["no 'record'", "no 'command'", "no 'commit'", "no 'date'", "no 'device'", "no 'load'"]


def _json_writes(path: Path) -> list[int]:
    """Lines of ``path`` that write JSON to a file other than through ``fastdiff.eval.record``: ``json.dump(...)``
    or ``X.write_text(json.dumps(...))``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "dump" and getattr(node.func.value, "id", None) == "json":
            lines.append(node.lineno)
        if node.func.attr == "write_text" and node.args and isinstance(node.args[0], (ast.Call, ast.BinOp)):
            inner = node.args[0].left if isinstance(node.args[0], ast.BinOp) else node.args[0]
            func = getattr(inner, "func", None)
            if isinstance(func, ast.Attribute) and func.attr == "dumps":
                dumped = inner.args[0] if inner.args else None
                made = isinstance(dumped, ast.Call) and getattr(dumped.func, "id", None) == "make_record"
                if not made:
                    lines.append(node.lineno)
    return lines


def test_every_benchmark_script_writes_results_records():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 30
    offenders = {p.name: lines for p in scripts if (lines := _json_writes(p))}
    assert offenders == {}, f"write results with fastdiff.eval.record.write_record: {offenders}"
    for writer in ("fastdiff/eval/bench.py", "fastdiff/cli/tune.py"):
        assert "write_record(" in (ROOT / writer).read_text()


def test_the_command_of_a_console_script_reads_as_typed(monkeypatch, tmp_path):
    from fastdiff.eval import provenance

    script = tmp_path / "bin" / "fastdiff"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python\n")
    monkeypatch.setattr("sys.orig_argv", ["/venv/bin/python3", str(script), "bench", "tiny-sd"], raising=False)
    assert provenance.command_line() == "fastdiff bench tiny-sd"
    monkeypatch.setattr("sys.orig_argv", ["/venv/bin/python", "benchmarks/x.py", "--runs", "3"], raising=False)
    assert provenance.command_line() == "python benchmarks/x.py --runs 3"


def test_a_rewritten_results_file_does_not_make_the_commit_dirty(tmp_path):
    import subprocess

    from fastdiff.eval.provenance import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "benchmarks" / "results" / "r.json").write_text('{"a": 1}')
    assert not git_commit(tmp_path).endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path).endswith("-dirty")
