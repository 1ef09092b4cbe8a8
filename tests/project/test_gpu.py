"""Every accelerator on a CUDA GPU (tiny models in fp16), and the full-size zoo models finite in fp16 and bf16.

Marked ``gpu`` and skipped without CUDA: run them on a GPU machine with ``pytest -m gpu tests/project/test_gpu.py``
(docs/gpu.md says what to carry there). Each accelerator is applied to a tiny pipeline on the GPU, must give
finite images of the right shape or be refused with an error naming it (the same refusals as the CPU matrix in
tests/core/test_coexist.py), and after ``remove()`` the pipeline gives its plain images again.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from fastdiff import FastPipeline
from fastdiff.core.inputs import make_inputs
from fastdiff.core.registry import AcceleratorError
from fastdiff.eval.compat import MATRIX_SPECS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VARIANTS = ("tiny-sd", "tiny-sdxl", "tiny-dit")
# On the GPU: real kernels for compile, the SDPA attention backend, fp8 where the chip has it.
GPU_SPECS = {
    **MATRIX_SPECS,
    "compile": "compile(mode=reduce-overhead)",
    "attention": "attention(backend=sdpa)",
    "fp8": "quantize(mode=fp8)",
}
REFUSED = {
    ("tiny-sd", "blockcache"),
    ("tiny-sdxl", "blockcache"),
    ("tiny-dit", "deepcache"),
    ("tiny-dit", "promptcache"),
}
NEEDS = {"quantize": "torchao", "fp8": "torchao", "prune": "torch_pruning"}  # optional packages
SHAPE = (1, 32, 32, 3)


def missing(accelerator: str) -> str | None:
    """Why ``accelerator`` cannot run on this machine (a package not carried, a chip without fp8), or None."""
    package = NEEDS.get(accelerator)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    if accelerator == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        return "fp8 needs compute capability >= 8.9"
    return None


@pytest.fixture(scope="module")
def pipes():
    from fastdiff.zoo.tiny import make_pipeline

    cache = {}

    def get(variant: str):
        if variant not in cache:
            pipe = make_pipeline(variant, "test", seed=0).to("cuda", torch.float16)
            pipe.set_progress_bar_config(disable=True)
            cache[variant] = pipe
        return cache[variant]

    return get


def generate(target, pipe, steps: int = 4) -> np.ndarray:
    inputs = make_inputs(pipe, 1)
    generator = torch.Generator().manual_seed(0)
    return target(**inputs, num_inference_steps=steps, output_type="np", generator=generator).images


@pytest.mark.parametrize("accelerator", sorted(GPU_SPECS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_accelerator_on_cuda(pipes, variant, accelerator):
    if problem := missing(accelerator):
        pytest.skip(problem)
    pipe = pipes(variant)
    fp = FastPipeline(pipe)
    try:
        plain = generate(fp, pipe)
        try:
            handle = fp.accelerate(GPU_SPECS[accelerator])
        except AcceleratorError as error:
            assert (variant, accelerator) in REFUSED, f"unexpected refusal: {error}"
            assert type(pipe).__name__ in str(error)
            return
        assert (variant, accelerator) not in REFUSED, "expected a refusal"
        runs = 3 if accelerator == "compile" else 1  # CUDA graphs record on the second call
        for _ in range(runs):
            images = generate(fp, pipe)
        assert images.shape == SHAPE and np.isfinite(images).all()
        handle.remove()
        np.testing.assert_allclose(generate(fp, pipe), plain, atol=2e-3, rtol=0)
    finally:
        fp.unwrap()
        torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["sd15", "sdxl", "dit-xl-2", "sd35-medium"])
def test_full_size_model_is_finite_in_half_precision(name, dtype):
    """The random full-size layouts (output layer scaled down) give finite images at their native size."""
    from fastdiff.zoo.full_size import make_full_pipeline
    from fastdiff.zoo.full_size_layouts import LAYOUTS

    with torch.device("cuda"):
        pipe = make_full_pipeline(name, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    try:
        images = generate(pipe, pipe, steps=2)
        side = LAYOUTS[name].side
        assert images.shape == (1, side, side, 3)
        assert np.isfinite(images).all(), f"{name} overflows in {dtype}"
    finally:
        del pipe
        torch.cuda.empty_cache()
