"""Cache settings chosen on one sample and reported on another: fastdiff's and diffusers' caches on a reference.

Two runs of benchmarks/flow_caching.py, one after the other in one process each (never side by side):

1. **Selection** (``--selection-seed``, default 0; one round): the uncached baseline and every candidate setting of
   each family (fastdiff's TeaCache thresholds and forecast intervals, diffusers' MagCache thresholds and
   TaylorSeer intervals). Each family's pick is its fastest candidate, on this seed, whose images keep
   ``MIN_PSNR`` dB against the uncached ones (steady at 100 images, where one FD moves by several points), whose
   accuracy is within 1 point of the baseline's and whose FD is at most ``1 + FD_BUDGET`` times the baseline's.
2. **Report** (``--report-seed``, default 1; ``--runs`` alternating rounds, default 3): the baseline and the four
   picks; speed ratios with their range over the rounds ("level" where the runs overlap), accuracy, FD and FD over
   the like-for-like floor with its interval. These are the figures the docs quote.

Both results files record the command, commit, date, device and load; the report names the selection file, the
rule and the picks. With ``FASTDIFF_MAX_LOAD`` set, a run that starts or ends above it writes nothing.

    python -m benchmarks.caching_select DIR --images 100          # DIR: fastdiff zoo build digits-flow DIR --size bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from fastdiff.eval.provenance import command_line
from fastdiff.eval.record import write_record

HERE = Path(__file__).parent
RESULTS = HERE / "results"
MIN_PSNR = 35.0  # a pick's images keep >= 35 dB PSNR against the uncached images on the selection seed
FD_BUDGET = 0.25  # its FD exceeds the baseline's by at most 25% (a guard: FD is noisy at 100 images)
ACCURACY_BUDGET = 0.01  # and its accuracy is at most 1 point lower
FIT = "benchmarks/results/moving_digits_teacache_fit.json"  # TeaCache's polynomial fitted on moving-digits


def families(teacache: str, thresholds: tuple[float, ...], mag: tuple[float, ...]) -> dict[str, list[str]]:
    """Family -> candidate NAME=SETTING, at matched settings of their kind."""
    return {
        "fd-teacache": [f"fd-teacache-{t}=blockcache(mode=teacache,threshold={t}{teacache})" for t in thresholds],
        "hf-magcache": [f"hf-magcache-{t}=hf-magcache:{t}:3" for t in mag],
        "fd-forecast": [f"fd-forecast-{n}=forecast(order=1,interval={n},warmup={n})" for n in (2, 3, 4)],
        "hf-taylorseer": [f"hf-taylorseer-{n}=hf-taylorseer:{n}:{n}:1" for n in (2, 3, 4)],
    }


PRESETS = {
    "digits-flow": {
        "steps": 28,
        "baseline": "euler-28=none",
        "out": RESULTS / "flow_caching.json",
        "families": families("", (0.08, 0.12, 0.2, 0.3), (0.1, 0.15, 0.25)),
    },
    "moving-digits": {
        "steps": 50,
        "baseline": "unipc-50=none",
        "out": RESULTS / "video_caching.json",
        "families": families(f",fit={FIT}", (0.1, 0.2, 0.3), (0.1, 0.15, 0.25)),
    },
}


def flow_caching(model: str, steps: int, configs: list[str], images: int, runs: int, seed: int, out: Path) -> dict:
    command = [
        sys.executable,
        str(HERE / "flow_caching.py"),
        "--model",
        model,
        "--steps",
        str(steps),
        "--images",
        str(images),
        "--runs",
        str(runs),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    for config in configs:
        command += ["--config", config]
    subprocess.run(command, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    result = json.loads(out.read_text())
    result["run_command"], result["command"] = (
        result["command"],
        command_line(),
    )  # this driver made the choice
    write_record(out, result, benchmark="caching_select", indent=1)
    return result


def pick(rows: list[dict], candidates: list[str]) -> tuple[str, list[dict]]:
    """The fastest candidate within the budgets of the baseline (rows[0]), and every candidate's verdict."""
    base, by_name = rows[0], {r["name"]: r for r in rows}
    verdicts = []
    for config in candidates:
        row = by_name[config.split("=", 1)[0]]
        ok = (
            row["psnr"] >= MIN_PSNR
            and row["accuracy"] >= base["accuracy"] - ACCURACY_BUDGET
            and row["fd"] <= (1 + FD_BUDGET) * base["fd"]
        )
        verdicts.append(
            {
                "config": config,
                "cpu_median": row["cpu_median"],
                "psnr": row["psnr"],
                "accuracy": row["accuracy"],
                "fd": row["fd"],
                "within_budget": ok,
            }
        )
    allowed = [v for v in verdicts if v["within_budget"]]
    if not allowed:
        return "", verdicts
    return min(allowed, key=lambda v: v["cpu_median"])["config"], verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the preset's pipeline directory")
    parser.add_argument("--preset", choices=list(PRESETS), default="digits-flow")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3, help="alternating rounds of the report run")
    parser.add_argument("--selection-seed", type=int, default=0)
    parser.add_argument("--report-seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="default: the preset's results file")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    out = args.out or preset["out"]
    baseline, steps = preset["baseline"], preset["steps"]
    if args.selection_seed == args.report_seed:
        raise SystemExit(f"--selection-seed and --report-seed must differ, both are {args.selection_seed}")
    selection_out = out.with_name(out.stem + "_selection.json")
    candidates = [c for family in preset["families"].values() for c in family]
    selection = flow_caching(
        args.model, steps, [baseline, *candidates], args.images, 1, args.selection_seed, selection_out
    )
    picks, verdicts = {}, {}
    for family, configs in preset["families"].items():
        picks[family], verdicts[family] = pick(selection["rows"], configs)
    chosen = [c for c in picks.values() if c]
    report = flow_caching(args.model, steps, [baseline, *chosen], args.images, args.runs, args.report_seed, out)
    report["selection"] = {
        "file": os.path.relpath(selection_out, HERE.parent),
        "seed": args.selection_seed,
        "report_seed": args.report_seed,
        "rule": f"per family, the fastest candidate with PSNR >= {MIN_PSNR:g} dB against the "
        f"uncached images, accuracy >= the baseline's - {ACCURACY_BUDGET} and FD <= "
        f"{1 + FD_BUDGET:g}x the baseline's, on the selection seed",
        "picks": picks,
        "candidates": verdicts,
    }
    write_record(out, report, benchmark="caching_select", indent=1)
    for family, config in picks.items():
        print(f"{family}: {config or 'no candidate within the budget'}")
    print(f"wrote {selection_out} and {out}")


if __name__ == "__main__":
    main()
