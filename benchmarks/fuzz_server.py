"""Fuzz ``fastdiff serve`` with schemathesis against its own OpenAPI schema: every operation, positive and
negative data, every check (no 5xx, responses and statuses as documented, invalid data refused, valid data
accepted), with and without the bearer token. Real servers on loopback ports, one torch thread each.

Two servers: the shipped digits model (class labels, no token) and tiny-sd (prompts, a token). Each is fuzzed
with ``--max-examples`` per operation; the tiny-sd one twice (with the token, and without it: every call that
needs it must be a documented 401).

    python benchmarks/fuzz_server.py --max-examples 1000   # make fuzz-server: results/fuzz_server.json
    python benchmarks/fuzz_server.py --max-examples 40 --out /tmp/fuzz.json   # what the CI test runs

Exit status 0 only when every run found no issue.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serve_load import Server  # benchmarks/serve_load.py: fastdiff serve in a subprocess

from fastdiff.eval.record import write_record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOKEN = "fuzz-token-0123456789"
LIMITS = ["--max-steps", "4", "--max-count", "2", "--max-side", "64"]  # keeps valid requests cheap


def fuzz(url: str, examples: int, seed: int, work: Path, name: str, token: str | None) -> dict:
    """One ``st run``; returns its exit status, counts and the failures' lines."""
    report = work / f"{name}.json"
    cmd = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--workers",
        "1",
        "--max-examples",
        str(examples),
        "--seed",
        str(seed),
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    summary = next((line.strip() for line in lines if "generated" in line), "")
    failures = [line.strip() for line in lines if line.strip().startswith("- ST")]
    return {
        "run": name,
        "token": bool(token),
        "exit_status": done.returncode,
        "summary": summary,
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz_server.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fd-fuzz-") as tmp:
        work = Path(tmp)
        (work / "token").write_text(TOKEN)
        # the servers build their zoo models into this cache: this process loads no torch (~20 s less)
        os.environ["FASTDIFF_CACHE"] = str(work / "cache")
        fast = "fast=scheduler(name=dpm++2m,steps=2)"
        token_flags = ["--token-file", str(work / "token")]
        servers = (  # both start now and load side by side
            Server("digits", "--profile", fast, *LIMITS, log=work / "digits.log"),
            Server("tiny-sd", "--profile", fast, *token_flags, *LIMITS, size="test", log=work / "tiny-sd.log"),
        )
        with servers[0] as plain, servers[1] as guarded:
            runs = [
                fuzz(plain.url, args.max_examples, args.seed, work, "digits", None),
                fuzz(guarded.url, args.max_examples, args.seed, work, "tiny-sd-token", TOKEN),
                fuzz(guarded.url, args.max_examples, args.seed, work, "tiny-sd-no-token", None),
            ]
    for run in runs:
        print(f"{run['run']:18s} exit {run['exit_status']}  {run['summary']}  ({run['seconds']} s)")
        for failure in run["failures"]:
            print("    ", failure)
    result = {
        "layout": "2-core CPU, 1 torch thread per server",
        "command": f"python benchmarks/fuzz_server.py --max-examples {args.max_examples} --seed {args.seed}",
        "schemathesis": _version("schemathesis"),
        "runs": runs,
        "passed": all(run["exit_status"] == 0 for run in runs),
    }
    write_record(args.out, result, benchmark="fuzz_server")
    return 0 if result["passed"] else 1


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
