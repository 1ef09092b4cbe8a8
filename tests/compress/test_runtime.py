"""compile / fuse / attention: same outputs (up to float rounding), exact restore, no per-step recompiles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import call, make_fp
from torch._dynamo.utils import counters

from fastdiff import AcceleratorError
from fastdiff.compress.attention import xformers_problem
from fastdiff.compress.compiled import compile_units

FAMILIES = ["tiny-sd", "tiny-dit", "tiny-ddpm"]


def processors(fp):
    return {n: m.processor for n, m in fp.denoiser.named_modules() if hasattr(m, "set_processor")}


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_backends_agree_and_restore_the_same_processors(family):
    fp = make_fp(family)
    before, original = call(fp), processors(fp)
    for backend, cls in (("math", "AttnProcessor"), ("sdpa", "AttnProcessor2_0")):
        handle = fp.accelerate(f"attention(backend={backend})")
        assert {type(p).__name__ for p in processors(fp).values()} == {cls}
        assert all(p is not original[n] for n, p in processors(fp).items())
        np.testing.assert_allclose(call(fp), before, atol=1e-4)
        handle.remove()
        assert processors(fp) == original
        np.testing.assert_array_equal(call(fp), before)


def test_xformers_without_a_kernel_falls_back_to_sdpa_with_a_warning():
    fp = make_fp("tiny-sd")
    problem = xformers_problem(torch.device("cpu"), torch.float32)
    if problem is None:
        pytest.skip("xformers runs on this machine")
    with pytest.warns(UserWarning, match=r"attention\(backend=xformers\): xformers .*; using sdpa instead"):
        fp.accelerate("attention(backend=xformers)")
    assert {type(p).__name__ for p in processors(fp).values()} == {"AttnProcessor2_0"}


@pytest.mark.parametrize("family", FAMILIES)
def test_fuse_qkv_and_channels_last_restore_modules_tensors_and_outputs(family):
    fp = make_fp(family)
    before, original = call(fp), processors(fp)
    keys = list(fp.denoiser.state_dict())
    strides = {n: p.stride() for n, p in fp.denoiser.named_parameters()}
    handle = fp.accelerate("fuse(channels_last=true)")
    attn = [m for m in fp.denoiser.modules() if hasattr(m, "set_processor")]
    assert {type(m.processor).__name__ for m in attn} == {"FusedAttnProcessor2_0"}
    assert all(hasattr(m, "to_qkv") or hasattr(m, "to_kv") for m in attn)
    convs = [m.weight for m in fp.denoiser.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    np.testing.assert_allclose(call(fp), before, atol=1e-4)
    handle.remove()
    assert processors(fp) == original
    assert list(fp.denoiser.state_dict()) == keys
    assert {n: p.stride() for n, p in fp.denoiser.named_parameters()} == strides
    assert "original_attn_processors" not in fp.denoiser.__dict__
    np.testing.assert_array_equal(call(fp), before)


def test_fuse_and_attention_backend_both_own_the_processors():
    fp = make_fp("tiny-sd")
    with pytest.raises(AcceleratorError, match=r"attention\(backend=sdpa\) conflicts with fuse"):
        fp.accelerate("fuse;attention")
    assert fp.accelerators == ()
    with pytest.raises(AcceleratorError, match="leave nothing to do"):
        fp.accelerate("fuse(qkv=false)")


def unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("family", ["tiny-sd", "tiny-dit"])
def test_compile_traces_each_unit_once_not_every_step(family):
    torch._dynamo.reset()  # graphs cached by earlier tests (the compatibility matrix) would count as zero
    fp = make_fp(family)
    before = call(fp)
    handle = fp.accelerate("compile(backend=eager)")  # eager backend: dynamo tracing without codegen
    start = unique_graphs()
    out = call(fp, steps=3)
    first = unique_graphs() - start
    assert 0 < first <= len(compile_units(fp.denoiser))  # one graph per unit class and shape at most
    np.testing.assert_allclose(out, before, atol=1e-5)
    assert fp.context.nfe == 3  # the step hooks stay eager and keep counting
    call(fp, steps=5)
    assert unique_graphs() - start == first
    handle.remove()
    np.testing.assert_array_equal(call(fp), before)


def test_compile_leaves_other_accelerators_hooks_eager():
    fp = make_fp("tiny-sd")
    fp.accelerate("tome(ratio=0.5)")
    merged = call(fp)
    names = {n for n, _ in compile_units(fp.denoiser)}
    assert "down_blocks.0" not in names and "down_blocks.1" in names  # tome hooks live in down_blocks.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit warning
        fp.accelerate("compile(backend=eager)")
        np.testing.assert_allclose(call(fp), merged, atol=1e-5)
        np.testing.assert_allclose(call(fp), merged, atol=1e-5)


@pytest.mark.full
def test_inductor_compile_matches_eager():
    fp = make_fp("tiny-dit")  # the smallest graph: inductor compiles tiny-sd's UNet for ~50 s on one core
    before = call(fp)
    fp.accelerate("compile")
    np.testing.assert_allclose(call(fp), before, atol=1e-4)
    start = unique_graphs()
    call(fp, steps=4)
    assert unique_graphs() == start
