"""Run two groups of benchmarks/flow_caching.py configs side by side (one process each) and merge their rows.

Each process runs its own baseline (the first config of each group, the same in both) on one torch thread; the
merged file keeps the first process's rows, then the second's without its baseline, each marked with its process,
and says which baseline the second's speedups and PSNRs are against. The presets are the matched settings of
flow_caching.sh (digits-flow) and video_caching.sh (moving-digits):

    python benchmarks/caching_pair.py digits-flow DIR --count 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from fastdiff.eval.provenance import with_provenance

HERE = Path(__file__).parent
FIT = "benchmarks/results/moving_digits_teacache_fit.json"  # TeaCache's polynomial fitted on moving-digits
PRESETS = {
    "digits-flow": {
        "steps": 28,
        "out": HERE / "results" / "flow_caching.json",
        "command": "benchmarks/flow_caching.sh",
        "first": ["euler-28=none", "fd-forecast-3=forecast(order=1,interval=3,warmup=3)",
                  "hf-taylorseer-3=hf-taylorseer:3:3:1", "fd-teacache-0.12=blockcache(mode=teacache,threshold=0.12)",
                  "hf-magcache-0.15=hf-magcache:0.15:3", "fd-teacache-0.3=blockcache(mode=teacache,threshold=0.3)"],
        "second": ["euler-28=none", "fd-forecast-2=forecast(order=1,interval=2,warmup=2)",
                   "hf-taylorseer-2=hf-taylorseer:2:2:1",
                   "fd-first-block-0.2=blockcache(mode=first-block,threshold=0.2)",
                   "fd-interval-2=blockcache(mode=interval,interval=2)"],
    },
    "moving-digits": {
        "steps": 50,
        "guidance": 5.0,  # WanPipeline's default, where these were measured (the model's own is 1.5)
        "out": HERE / "results" / "video_caching.json",
        "command": "benchmarks/video_caching.sh",
        "first": ["unipc-50=none", "fd-forecast-3=forecast(order=1,interval=3,warmup=3)",
                  "hf-taylorseer-3=hf-taylorseer:3:3:1",
                  f"fd-teacache-0.1=blockcache(mode=teacache,threshold=0.1,fit={FIT})",
                  "hf-magcache-0.1=hf-magcache:0.1:3",
                  f"fd-teacache-0.2=blockcache(mode=teacache,threshold=0.2,fit={FIT})"],
        "second": ["unipc-50=none", "fd-forecast-2=forecast(order=1,interval=2,warmup=2)",
                   "hf-taylorseer-2=hf-taylorseer:2:2:1",
                   "fd-first-block-0.1=blockcache(mode=first-block,threshold=0.1)", "hf-fbc-0.1=hf-fbc:0.1",
                   "fd-interval-2=blockcache(mode=interval,interval=2)"],
    },
}  # fmt: skip


def launch(
    model: str, preset: dict, count: int, configs: list[str], out: Path, log: Path
) -> subprocess.Popen:
    command = [
        sys.executable,
        str(HERE / "flow_caching.py"),
        "--model",
        model,
        "--steps",
        str(preset["steps"]),
    ]
    if "guidance" in preset:
        command += ["--guidance", str(preset["guidance"])]
    command += ["--images", str(count), "--runs", "1", "--out", str(out)]
    for config in configs:
        command += ["--config", config]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def merge(first: dict, second: dict, label: str, command: str) -> dict:
    base = second["rows"][0]
    return dict(
        first,
        model=label,
        date=str(date.today()),
        device="2-core CPU, 1 torch thread per process",
        command=command,
        label=label,
        split=(
            f"two processes side by side, each with its own {base['name']} baseline (the second's: "
            f"{base['cpu_median']} CPU s, FD {base['fd']:.2f}); speedup and PSNR against the own process's"
        ),
        rows=[dict(r, process=1) for r in first["rows"]] + [dict(r, process=2) for r in second["rows"][1:]],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=list(PRESETS))
    parser.add_argument("model", help="the pipeline directory (fastdiff zoo build PRESET DIR --size bench)")
    parser.add_argument("--count", type=int, default=100, help="images (or clips) per call")
    parser.add_argument("--out", type=Path, default=None, help="default: the preset's results file")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    tmp = Path(tempfile.mkdtemp(prefix="caching-pair-"))
    runs = [
        launch(args.model, preset, args.count, preset[group], tmp / f"{i}.json", tmp / f"{i}.log")
        for i, group in ((1, "first"), (2, "second"))
    ]
    for i, run in enumerate(runs, 1):
        if run.wait() != 0:
            raise SystemExit(f"process {i} failed (exit {run.returncode}); its log: {tmp / f'{i}.log'}")
    first, second = (json.loads((tmp / f"{i}.json").read_text()) for i in (1, 2))
    out = merge(first, second, args.preset, f"sh {preset['command']} MODEL {args.count}")
    path = args.out or preset["out"]
    path.write_text(json.dumps(with_provenance(out), indent=1))
    for r in out["rows"]:
        extra = f" dir {r['direction_accuracy']:.3f}" if "direction_accuracy" in r else ""
        print(f"{r['name']:22s} {r['speedup']:6.2f}x computed {r['computed']:.3f} acc {r['accuracy']:.3f}{extra} "
              f"FD {r['fd']:6.2f} PSNR {r['psnr']}")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
