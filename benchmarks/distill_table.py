"""Markdown tables of the distillation benchmark (README: Distillation) and the students' training records.

Run after ``benchmarks/train_students.sh ROOT`` and ``benchmarks/distill_bench.sh ROOT``::

    python benchmarks/distill_table.py --students ROOT   # also writes results/distill_training.json
    python benchmarks/distill_table.py                   # tables from the JSON already in results/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastdiff.eval.record import write_record

RESULTS = Path(__file__).resolve().parent / "results"
STUDENTS = ("cons-g2", "lcm-lora-g2", "progressive-g2", "consistency-g1", "progressive-g1")


def training_records(root: Path) -> dict:
    """Per student run: steps, wall time, peak memory and device from its fastdiff_distill.json."""
    records = {}
    for name in STUDENTS:
        manifest = root / name / "fastdiff_distill.json"
        if not manifest.is_file():
            continue
        info = json.loads(manifest.read_text())
        rounds = info.get("rounds") or {}
        if not rounds:  # a finished progressive run: each round's report is in its steps-N manifest
            for sub in sorted(root.glob(f"{name}/steps-*/fastdiff_distill.json")):
                rounds[sub.parent.name] = json.loads(sub.read_text()).get("train", {})
        reports = list(rounds.values()) if rounds else [info.get("train", {})]
        logs = sorted((root / name).glob("steps-*/loss.csv")) or [root / name / "loss.csv"]
        records[name] = {
            "command": info.get("command"),
            "train_steps": sum(r.get("steps", 0) for r in reports),
            "wall_seconds": round(sum(_logged_seconds(log) for log in logs if log.is_file()), 1),
            "peak_memory_mib": max((r.get("peak_memory_mib", 0) for r in reports), default=None),
            "device": sorted({r.get("device") for r in reports if r.get("device")}),
            "trainable_parameters": reports[0].get("trainable_parameters"),
            "parameters": reports[0].get("parameters"),
            "rounds": {k: {"steps": r.get("steps"), "wall_seconds": r.get("seconds")} for k, r in rounds.items()},
        }
    return records


def _logged_seconds(log: Path) -> float:
    """Training seconds in a loss.csv, summed over resumed segments (the clock restarts at each resume)."""
    total, last = 0.0, 0.0
    for line in log.read_text().splitlines()[1:]:
        seconds = float(line.split(",")[3])
        if seconds < last:
            total += last
        last = seconds
    return total + last


def bench_table(result: dict) -> str:
    rows = result["configs"]
    base = rows[0]
    batch = result["settings"]["batch"]
    lines = [
        "| config | NFE | accuracy | FD (floor) | CPU s / 100 images | speedup vs DDIM 50 (CPU time) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        per100 = row["cpu_seconds_median"] * 100 / batch
        lines.append(
            f"| {row['name']} | {row['denoiser_calls']} | {100 * row['accuracy']:.1f}% | {row['fd']:.2f} "
            f"({row['fd_floor']:.2f}) | {per100:.2f} | {base['cpu_seconds_median'] / row['cpu_seconds_median']:.1f}x |"
        )
    return "\n".join(lines)


def training_table(records: dict) -> str:
    lines = ["| student | training steps | wall time | peak memory | device |", "|---|---|---|---|---|"]
    for name, r in records.items():
        if name not in STUDENTS:  # the record's provenance (command, commit, date, ...)
            continue
        lines.append(
            f"| {name} | {r['train_steps']} | {r['wall_seconds'] / 60:.1f} min | "
            f"{r['peak_memory_mib']:.0f} MiB | {', '.join(r['device'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=Path, help="root of train_students.sh (refreshes the training JSON)")
    args = parser.parse_args()
    training = RESULTS / "distill_training.json"
    if args.students:
        write_record(training, training_records(args.students), benchmark="distill_table")
    for tag, title in (("g2", "guidance 2"), ("g1", "guidance 1")):
        path = RESULTS / f"distill_{tag}.json"
        if path.is_file():
            print(f"### Digits reference, {title}\n\n{bench_table(json.loads(path.read_text()))}\n")
    if training.is_file():
        print(f"### Training (2 CPU cores)\n\n{training_table(json.loads(training.read_text()))}")


if __name__ == "__main__":
    main()
