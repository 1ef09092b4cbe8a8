"""Worker functions for ``launch``: a pipeline call on every rank (what ``fastdiff generate --devices N`` runs).

Example::

    from fastdiff.parallel.run import generate_parallel

    out = generate_parallel("/tmp/tiny-sd", "parallel(mode=cfg,devices=2)", {"prompt": ["a fox"]}, devices=2)
    out["images"].shape, out["seconds"]
"""

from __future__ import annotations

import time

import torch


def generate(rank: int, world: int, model, specs: list[str], call: dict, seed: int = 0, warmup: bool = False):
    """On every rank: one FastPipeline per spec string, one seeded call each; {spec: images, seconds}."""
    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    results = {}
    for specs_one in specs:
        handle = fp.accelerate(specs_one) if specs_one else None
        try:
            if warmup:
                fp(**call, output_type="np", generator=torch.Generator().manual_seed(seed))
            start = time.perf_counter()
            images = fp(**call, output_type="np", generator=torch.Generator().manual_seed(seed)).images
            results[specs_one] = {"images": images, "seconds": time.perf_counter() - start}
        finally:
            if handle is not None:
                handle.remove()
    return results


def generate_parallel(model, specs: str, call: dict, devices: int, seed: int = 0, timeout_s: float = 60.0):
    """``generate`` on ``devices`` processes; rank 0's {"images", "seconds"} for ``specs``."""
    from fastdiff.parallel.launch import launch

    return launch(generate, devices, str(model), [specs], call, seed, timeout_s=timeout_s)[specs]
