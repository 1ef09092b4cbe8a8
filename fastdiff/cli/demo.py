"""``fastdiff demo`` (``make demo``): the main job on the embedded default model.

Uses the digits reference model that ships with the package (a trained class-conditional UNet, copied into
the cache after its sha256 check, in well under a second), then runs a baseline and accelerated configs side
by side and prints seconds, speedup, accuracy and FD, writing a PNG grid of generated digits per config.
``retrain=True`` (``fastdiff demo --retrain``) trains the reference first instead (3000 steps, ~15-25 min).

Example::

    from fastdiff.cli.demo import run_demo
    run_demo("out/demo")               # the shipped model: about 2 minutes on 2 cores
    run_demo("out/demo", quick=True)   # a 200-step model trained on the spot: shows the flow, not the quality
"""

from __future__ import annotations

from pathlib import Path

from fastdiff.cli.resolve import cache_dir
from fastdiff.eval.bench import format_table, run_bench

DEMO_CONFIGS = [
    ("ddim 50 (baseline)", "scheduler(name=ddim,steps=50)"),
    ("dpm++2m 20", "scheduler(name=dpm++2m,steps=20)"),
    ("dpm++2m 10", "scheduler(name=dpm++2m,steps=10)"),
    ("unipc 5", "scheduler(name=unipc,steps=5)"),
    ("dpm++2m 20 + deepcache", "scheduler(name=dpm++2m,steps=20);deepcache(interval=3,branch=1)"),
]
DEMO_IMAGES = 500  # 50 per digit: accuracy and FD on the same sample size as benchmarks/reference.md


def reference_model(quick: bool = False, retrain: bool = False) -> Path:
    """The digits reference model directory in the cache: the shipped one (hash-checked), or trained.

    Example::

        path = reference_model()   # $FASTDIFF_CACHE/digits-bench, a copy of references/fastdiff_references/data/digits
    """
    from fastdiff import zoo
    from fastdiff.zoo.reference import SIZES, build_reference
    from fastdiff.zoo.shipped import install_digits, is_installed

    if quick:
        target = cache_dir() / "digits-test"
        if not (target / "model_index.json").is_file():
            print(f"training a 200-step digits model into {target}; cached for later runs")
            zoo.build("digits", target, size="test")
        return target
    if retrain:
        target = cache_dir() / "digits-retrained"
        print(f"retraining the digits reference model into {target} (fastdiff reference build {target})")
        return build_reference(target, **SIZES["bench"])
    target = cache_dir() / "digits-bench"
    if not is_installed(target):
        install_digits(target)
        print(f"shipped digits reference model (sha256-checked) copied to {target}")
    return target


def run_demo(
    out_dir: str | Path = "out/demo",
    runs: int = 1,
    quick: bool = False,
    configs=None,
    retrain: bool = False,
    threads: int | None = 1,
    images: int | None = None,
) -> dict:
    """Bench the demo configs on the reference model; print the table; write demo.json and PNG grids.

    ``runs`` timed calls of ``images`` digits per config (default 500; ``quick``: 100), after one untimed
    call of every config on 10 images (one-off start-up costs, which the first config would otherwise pay).
    ``threads`` (default 1) sets torch's CPU threads: on a 2-core machine shared with any other work, two
    threads make every call several times slower, one thread keeps the timings steady.

    Example::

        result = run_demo("out/demo", runs=1)
    """
    import torch

    from fastdiff import FastPipeline

    if threads:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    model = reference_model(quick, retrain)
    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    _warm_up(fp, configs or DEMO_CONFIGS)
    result = run_bench(
        fp,
        configs or DEMO_CONFIGS,
        steps=None,
        runs=runs,
        threads=threads,
        json_path=out / "demo.json",
        image_dir=out,
        batch=images or (100 if quick else DEMO_IMAGES),
        warmup=False,
    )
    print(format_table(result))
    print(f"\nPNG grids per config and demo.json are in {out}/")
    return result


def _warm_up(fp, configs) -> None:
    """One small untimed call per config: pays one-off costs (kernel selection, allocations) up front."""
    import torch

    for _, specs in configs:
        handle = fp.accelerate(specs) if specs.strip() else None
        try:
            fp(class_labels=list(range(10)), output_type="np", generator=torch.Generator().manual_seed(0))
        finally:
            if handle is not None:
                handle.remove()
