"""digits-sd's quality on several seeds: dpm++2m 20, 500 images per seed, at guidance 5 (the model's default) and 2.

Each (guidance, seed) is one ``run_bench`` call of one timed run (quality is the point here, not speed): accuracy,
FD, and FD over a like-for-like floor drawn for that seed (its interval over the draws). The spread over seeds
shows how far one seed's figure can be trusted.

    python benchmarks/digits_sd_seeds.py   # benchmarks/results/digits_sd_seeds.json (about 5 minutes, 2 threads)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastdiff.eval.bench import run_bench
from fastdiff.eval.record import write_record
from fastdiff.zoo.shipped import install

RESULTS = Path(__file__).resolve().parent / "results"
DPM = "scheduler(name=dpm++2m,steps=20)"
KEPT = ("accuracy", "fd", "fd_floor", "fd_floor_low", "fd_floor_high", "fd_ratio", "fd_ratio_low", "fd_ratio_high")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(".fastdiff-cache/digits-sd"))
    parser.add_argument("--guidance", type=float, nargs="+", default=[5.0, 2.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "digits_sd_seeds.json")
    args = parser.parse_args(argv)
    if not (args.model / "model_index.json").is_file():
        install(args.model, "digits-sd")
    rows = []
    for guidance in args.guidance:
        for seed in args.seeds:
            bench = run_bench(
                args.model,
                [("dpm++2m 20", DPM)],
                steps=None,
                runs=1,
                seed=seed,
                threads=args.threads,
                batch=args.batch,
                guidance=guidance,
                warmup=False,
            )
            config = bench["configs"][0]
            row = {"guidance": guidance, "seed": seed, **{k: config.get(k) for k in KEPT}}
            rows.append({**row, "seconds": config["seconds_median"]})
            print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()))
    record = {
        "model": str(args.model),
        "sampler": DPM,
        "images": args.batch,
        "target": "guidance 5: accuracy >= 95%, FD <= 3x its floor",
        "runs": rows,
    }
    write_record(args.out, record, benchmark="digits_sd_seeds")


if __name__ == "__main__":
    main()
