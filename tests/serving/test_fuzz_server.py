"""Schemathesis fuzzes the real server against its own OpenAPI schema (benchmarks/fuzz_server.py: the digits
and tiny-sd servers, with and without the token, every check): no 5xx, every response as documented, invalid
data refused, valid data accepted. 40 examples per operation here (the servers' start-up is most of the
minute); ``make fuzz-server`` runs the longer profile into benchmarks/results/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_no_issue(tmp_path):
    out = tmp_path / "fuzz.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "fuzz_server.py"),
        "--max-examples",
        "40",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=850)
    result = json.loads(out.read_text())
    assert [run["run"] for run in result["runs"]] == ["digits", "tiny-sd-token", "tiny-sd-no-token"]
    for run in result["runs"]:
        assert run["exit_status"] == 0 and not run["failures"], (run, done.stdout[-3000:])
        assert " passed" in run["summary"] and "generated" in run["summary"]
    assert done.returncode == 0 and result["passed"]
