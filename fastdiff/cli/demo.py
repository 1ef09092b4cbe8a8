"""``fastdiff demo`` (``make demo``): the main job on the embedded default model.

Builds the digits reference model on first use (a trained class-conditional UNet, about 13 minutes on 2 cores,
cached after), then runs a baseline and accelerated configs side by side and prints seconds, speedup,
accuracy and FD, writing a PNG grid of generated digits per config.

Example::

    from fastdiff.cli.demo import run_demo
    run_demo("out/demo", quick=True)   # 1-minute model: shows the flow, not the quality
"""

from __future__ import annotations

from pathlib import Path

from fastdiff.cli.main import cache_dir
from fastdiff.eval.bench import format_table, run_bench

DEMO_CONFIGS = [
    ("ddim 50 (baseline)", "scheduler(name=ddim,steps=50)"),
    ("dpm++2m 20", "scheduler(name=dpm++2m,steps=20)"),
    ("dpm++2m 10", "scheduler(name=dpm++2m,steps=10)"),
    ("unipc 5", "scheduler(name=unipc,steps=5)"),
    ("dpm++2m 20 + deepcache", "scheduler(name=dpm++2m,steps=20);deepcache(interval=3,branch=1)"),
]


def reference_model(quick: bool = False) -> Path:
    """The digits reference model directory, built into the cache on first use."""
    from fastdiff import zoo

    size = "test" if quick else "bench"
    target = cache_dir() / f"digits-{size}"
    if not (target / "model_index.json").is_file():
        print(f"building the digits reference model ({size}) into {target}; cached for later runs")
        zoo.build("digits", target, size=size)
    return target


def run_demo(out_dir: str | Path = "out/demo", runs: int = 2, quick: bool = False, configs=None) -> dict:
    out = Path(out_dir)
    model = reference_model(quick)
    result = run_bench(
        model, configs or DEMO_CONFIGS, steps=None, runs=runs, json_path=out / "demo.json", image_dir=out,
        batch=100 if quick else None,
    )  # fmt: skip
    print(format_table(result))
    print(f"\nPNG grids per config and demo.json are in {out}/")
    return result
