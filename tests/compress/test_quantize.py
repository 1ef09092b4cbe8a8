"""Quantization: torchao int8 on Linear layers, exact restore, save/reload, loud refusals."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import call, make_fp
from helpers import psnr as helpers_psnr

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.quantize import load_quantized, quantizable_linears, save_quantized
from fastdiff.core.models import UnsupportedModelError

pytest.importorskip("torchao")


psnr = functools.partial(helpers_psnr, float64=True)


@pytest.mark.parametrize("mode", ["int8-dynamic", "int8-weight"])
@pytest.mark.parametrize("family", ["tiny-sd", "tiny-dit", "tiny-ddpm"])
def test_int8_quantizes_linears_only_and_restores_exactly(family, mode):
    fp = make_fp(family)
    before = call(fp)
    layers = quantizable_linears(fp.denoiser)
    originals = [m.weight for _, m in layers]
    reprs = [repr(m) for _, m in layers]
    convs = {n: m.weight for n, m in fp.denoiser.named_modules() if isinstance(m, torch.nn.Conv2d)}
    handle = fp.accelerate(f"quantize(mode={mode})")
    assert all(type(m.weight).__name__ == "Int8Tensor" for _, m in layers)
    assert all(m.weight is convs[n] for n, m in fp.denoiser.named_modules() if isinstance(m, torch.nn.Conv2d))
    quantized = call(fp)
    assert not np.array_equal(quantized, before)
    assert psnr(quantized, before) > 35
    handle.remove()
    assert all(m.weight is w for (_, m), w in zip(layers, originals))
    assert [repr(m) for _, m in layers] == reprs
    np.testing.assert_array_equal(call(fp), before)


def test_fp8_is_refused_on_cpu_and_nothing_changes():
    fp = make_fp("tiny-sd")
    weights = [m.weight for _, m in quantizable_linears(fp.denoiser)]
    with pytest.raises(AcceleratorError, match=r"mode=fp8\) needs a CUDA GPU .* the denoiser is on cpu"):
        fp.accelerate("quantize(mode=fp8)")
    assert fp.accelerators == ()
    assert [m.weight for _, m in quantizable_linears(fp.denoiser)] == weights


def test_one_weight_changer_at_a_time():
    fp = make_fp("tiny-sd")
    fp.accelerate("quantize")
    with pytest.raises(AcceleratorError, match="conflicts with quantize.*denoiser.weights"):
        fp.accelerate("quantize(mode=int8-weight)")
    with pytest.raises(AcceleratorError, match=r"fuse\(qkv=true\) conflicts with quantize"):
        fp.accelerate("fuse")
    with pytest.raises(AcceleratorError, match="'int4' is not allowed; choose one of int8-dynamic"):
        fp.accelerate("quantize(mode=int4)")


def test_quantized_pipeline_saves_and_reloads(tmp_path):
    fp = make_fp("tiny-sd")
    fp.accelerate("quantize(mode=int8-dynamic)")
    quantized = call(fp)
    # torchao tensors do not go through safetensors; the pickle format round-trips them.
    fp.save_pretrained(tmp_path / "pipe", safe_serialization=False)
    loaded = FastPipeline.from_pretrained(tmp_path / "pipe")
    loaded.pipe.set_progress_bar_config(disable=True)
    assert loaded.accelerators == ()
    np.testing.assert_array_equal(call(loaded), quantized)
    # The denoiser's state dict alone, into a fresh fp32 model of the same architecture.
    save_quantized(fp, tmp_path / "unet.pt")
    fresh = make_fp("tiny-sd")
    load_quantized(fresh, tmp_path / "unet.pt")
    np.testing.assert_array_equal(call(fresh), quantized)


def test_unsupported_model_fails_loudly():
    from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

    gmm = FastPipeline(GMMPipeline(unet=GMMDenoiser(mixture_seed=0), scheduler=default_scheduler()))
    with pytest.raises(UnsupportedModelError, match="quantize does not support GMMDenoiser"):
        gmm.accelerate("quantize")
