"""Worker functions for ``launch``: a pipeline call on every rank (what ``fastdiff generate --devices N`` runs).

Example::

    from fastdiff.parallel.run import generate_parallel

    out = generate_parallel("/tmp/tiny-sd", "parallel(mode=cfg,devices=2)", {"prompt": ["a fox"]}, devices=2)
    out["images"].shape, out["seconds"]
"""

from __future__ import annotations

import time

import torch

from fastdiff.core.tensors import pixels


def generate(
    rank: int,
    world: int,
    model,
    specs: list[str],
    call: dict,
    seed: int = 0,
    warmup: bool = False,
    output_type: str = "np",
):
    """On every rank: one FastPipeline per spec string, one seeded call each; {spec: images, seconds}
    (``output_type="latent"``: the denoised latents, no decoding)."""
    from fastdiff.core.pipeline import FastPipeline

    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    results = {}
    for specs_one in specs:
        handle = fp.accelerate(specs_one) if specs_one else None
        try:
            if warmup:
                fp(**call, output_type=output_type, generator=torch.Generator().manual_seed(seed))
            start = time.perf_counter()
            images = pixels(fp(**call, output_type=output_type, generator=torch.Generator().manual_seed(seed)))
            results[specs_one] = {"images": images, "seconds": time.perf_counter() - start}
        finally:
            if handle is not None:
                handle.remove()
    return results


def generate_parallel(model, specs: str, call: dict, devices: int, seed: int = 0, timeout_s: float = 60.0):
    """``generate`` on ``devices`` processes; rank 0's {"images", "seconds"} for ``specs``."""
    from fastdiff.parallel.launch import launch

    return launch(generate, devices, str(model), [specs], call, seed, timeout_s=timeout_s)[specs]


def bench_config(rank: int, world: int, model, specs: str, call: dict, runs: int, seed: int, warmup: bool, steps):
    """On every rank: ``fastdiff bench``'s timed runs of one config; (seconds, images, peak RSS, CPU seconds, NFE)."""
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.timing import time_runs

    fp = FastPipeline.from_pretrained(model, accelerators=specs)
    fp.pipe.set_progress_bar_config(disable=True)
    if steps and "num_inference_steps" not in fp._defaults:
        call = dict(call, num_inference_steps=steps)

    def once():
        return fp(**call, generator=torch.Generator().manual_seed(seed))

    seconds, output, rss, cpu_seconds = time_runs(once, runs, warmup=warmup)
    return seconds, pixels(output), rss, cpu_seconds, fp.context.nfe


def bench_parallel(
    model,
    specs: str,
    call: dict,
    devices: int,
    runs: int,
    seed: int,
    warmup: bool,
    threads: int = 1,
    steps=None,
    timeout_s: float = 300.0,
):
    """``bench_config`` on ``devices`` processes of ``threads`` threads each; rank 0's figures."""
    from fastdiff.parallel.launch import launch

    args = (str(model), specs, call, runs, seed, warmup, steps)
    return launch(bench_config, devices, *args, timeout_s=timeout_s, threads=threads)
