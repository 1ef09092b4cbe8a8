"""Render benchmarks/reference.md's sampler tables from the digits-reference bench JSONs.

The shipped model's rows (guidance 1 and 2), on `fastdiff zoo build digits .fastdiff-cache/digits --size bench`:
  fastdiff bench .fastdiff-cache/digits --threads 1 --runs 3 --guidance $g \\
    --config 'ddim50=scheduler(name=ddim,steps=50)' --config 'ddim20=scheduler(name=ddim,steps=20)' \\
    --config 'ddim10=scheduler(name=ddim,steps=10)' --config 'dpm++2m20=scheduler(name=dpm++2m,steps=20)' \\
    --config 'dpm++2m10=scheduler(name=dpm++2m,steps=10)' --config 'dpm++2m5=scheduler(name=dpm++2m,steps=5)' \\
    --config 'unipc10=scheduler(name=unipc,steps=10)' --config 'unipc5=scheduler(name=unipc,steps=5)' \\
    --json benchmarks/results/reference_shipped_g$g.json
(each ratio with its rounds' range; the files record the exact command). DDPM 1000 (the slow end), on the
shipped model at guidance 1 and 2:
  fastdiff bench .fastdiff-cache/digits --threads 1 --runs 1 --no-warmup --guidance $g \\
    --config ddpm1000="scheduler(name=ddpm,steps=1000)" --json benchmarks/results/reference_ddpm_g$g.json
then:  python benchmarks/reference_report.py   (prints the table), or with given bench JSONs as arguments.
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main(paths: list[str]) -> None:
    print("| sampler | guidance | NFE | accuracy | FD | fd_floor | CPU s / 100 images | wall s / 100 images |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:  # given bench JSONs (guidance from their settings), else the committed reference ones
        result = json.loads(Path(path).read_text())
        guidance = result["settings"]["inputs"].get("guidance_scale", 1.0)
        _rows(result, int(guidance) if float(guidance).is_integer() else guidance)
    for guidance in () if paths else (1, 2):
        for path in (RESULTS / f"reference_shipped_g{guidance}.json", RESULTS / f"reference_ddpm_g{guidance}.json"):
            if path.exists():
                _rows(json.loads(path.read_text()), guidance)


def _rows(result: dict, guidance: int) -> None:
    per100 = 100 / result["settings"]["batch"]
    for row in result["configs"]:
        print(
            f"| {row['name']} | {guidance} | {row['denoiser_calls']} | {100 * row['accuracy']:.1f}% | "
            f"{row['fd']:.2f} | {row['fd_floor']:.2f} | {row['cpu_seconds_median'] * per100:.2f} | "
            f"{row['seconds_median'] * per100:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
