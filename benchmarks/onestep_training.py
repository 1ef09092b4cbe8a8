"""Training time, peak memory and the checkpoint pick of the one-step students that
``benchmarks/onestep_digits.sh ROOT`` trained, read from their ``fastdiff_distill.json`` manifests and the
``/usr/bin/time`` lines in ``ROOT/time-*.txt``.

Run::

    .venv/bin/python -m benchmarks.onestep_training --root /tmp/fastdiff-onestep

Writes ``benchmarks/results/onestep_training.json``: per student, the training report (updates, seconds, peak
memory as the training loop measured it), the wall time and peak RSS of the whole command, and for DMD
students the snapshots' figures on the selection seeds, the pick and its figures on the report seeds.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from fastdiff.eval.provenance import load_average, provenance
from fastdiff.eval.record import write_record

RESULTS = Path(__file__).resolve().parent / "results"


def command_time(root: Path, name: str) -> dict | None:
    path = root / f"time-{name}.txt"
    if not path.is_file():
        return None
    found = re.search(r"([\d.]+) s wall, peak RSS (\d+) KiB", path.read_text())
    return {"wall_seconds": float(found[1]), "peak_rss_mib": int(found[2]) / 1024} if found else None


def student(root: Path, name: str) -> dict:
    run = json.loads((root / name / "fastdiff_distill.json").read_text())
    row = {"name": name, "command": run["command"], "time": command_time(root, name)}
    if "rounds" in run:  # progressive: one training report per halving
        row["train"] = run["rounds"]
        row["student"] = json.loads((root / name / "steps-1" / "fastdiff_distill.json").read_text()).get("measured")
    else:
        info = json.loads((root / name / "steps-1" / "fastdiff_distill.json").read_text())
        row.update(train=info["train"], selection=info.get("selection"), measured=info.get("measured"))
    return row


def is_run(path: Path) -> bool:
    """A training run's directory (its manifest records the command), not a teacher or an installed student."""
    manifest = path / "fastdiff_distill.json"
    return manifest.is_file() and "command" in json.loads(manifest.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/tmp/fastdiff-onestep")
    parser.add_argument("--json", default=str(RESULTS / "onestep_training.json"))
    args = parser.parse_args()
    root, load_start = Path(args.root), load_average()
    names = sorted(p.name for p in root.iterdir() if is_run(p))
    result = {
        "root": str(root),
        "students": [student(root, n) for n in names],
        **provenance(load_start=load_start),
    }
    write_record(args.json, result, benchmark="onestep_training", indent=1)
    for row in result["students"]:
        print(row["name"], row["time"])
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
