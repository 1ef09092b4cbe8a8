"""The TeaCache indicator of every family with modulation facts is exactly the modulated input its first block
hands to its attention (adaLN norms: Flux, SD3, HunyuanVideo; adaLN-single tables: PixArt-Sigma, Sana, Wan,
LTX-Video), and blockcache(mode=teacache) skips blocks on each; the others are refused naming the block."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import Counter

from fastdiff import FastPipeline, UnsupportedModelError
from fastdiff.cache.blockcache_teacache import modulated_input, modulation_of, relative_change
from fastdiff.cache.blockio import first_and_last_blocks
from fastdiff.core.denoisers import block_io
from fastdiff.core.inputs import make_inputs
from fastdiff.core.tensors import pixels
from fastdiff.zoo.tiny import make_pipeline

# family -> the first block's attention submodule, which takes the modulated input as its hidden states
WITH_FACTS = {
    "tiny-flux": "attn",
    "tiny-sd3": "attn",
    "tiny-hunyuan-video": "attn",
    "tiny-pixart-sigma": "attn1",
    "tiny-sana": "attn1",
    "tiny-wan": "attn1",
    "tiny-ltx": "attn1",
}
REFUSED = ("tiny-qwen-image", "tiny-zimage", "tiny-cogvideox", "tiny-dit")


def call(pipe, target=None, steps: int = 6) -> np.ndarray:
    kwargs = make_inputs(pipe, 1)
    out = (target or pipe)(
        **kwargs, num_inference_steps=steps, output_type="np", generator=torch.Generator().manual_seed(0)
    )
    return pixels(out)


@pytest.mark.parametrize("name", WITH_FACTS)
def test_indicator_is_the_input_the_first_attention_receives(name):
    pipe = make_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    first, _ = first_and_last_blocks(FastPipeline(pipe).denoiser)
    io, seen = block_io(first), {}

    def on_block(module, args, kwargs):
        seen.setdefault("indicator", modulated_input(module, io, args, kwargs))

    def on_attention(module, args, kwargs):
        seen.setdefault("attention", kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

    hooks = [
        first.register_forward_pre_hook(on_block, with_kwargs=True),
        getattr(first, WITH_FACTS[name]).register_forward_pre_hook(on_attention, with_kwargs=True),
    ]
    try:
        call(pipe, steps=2)
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(seen["indicator"], seen["attention"].to(seen["indicator"].dtype))


@pytest.mark.parametrize("name", [n for n in WITH_FACTS if n != "tiny-flux"])  # Flux: tests/core/test_coexist_flow.py
def test_teacache_skips_blocks_and_removes_exactly(name):
    pipe = make_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    fp = FastPipeline(pipe)
    plain = call(pipe, fp)
    handle = fp.accelerate("blockcache(mode=teacache,threshold=0.5)")
    cached = call(pipe, fp)
    assert handle.handles[0].state.skipped > 0 and np.isfinite(cached).all()
    handle.remove()
    np.testing.assert_array_equal(call(pipe, fp), plain)
    fp.unwrap()


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-sd3", "tiny-hunyuan-video"])
def test_computed_steps_call_the_adaln_layer_once_and_match_the_plain_model(name):
    """Where the first block's adaLN layer returns the modulated input, the block reuses TeaCache's call of it:
    with nothing skipped (threshold 0) the layer runs once per evaluation, as without TeaCache, bit for bit."""
    pipe = make_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    fp = FastPipeline(pipe)
    first, _ = first_and_last_blocks(fp.denoiser)
    layer = getattr(first, modulation_of(first)[0]).linear
    counter = Counter(layer)
    plain, plain_calls = call(pipe, fp), counter.calls
    handle = fp.accelerate("blockcache(mode=teacache,threshold=0)")
    counter.calls = 0
    cached = call(pipe, fp)
    assert handle.handles[0].state.skipped == 0 and counter.calls == plain_calls > 0
    np.testing.assert_array_equal(cached, plain)
    handle.remove()
    counter.handle.remove()
    fp.unwrap()


@pytest.mark.parametrize("name", REFUSED)
def test_families_without_facts_are_refused_naming_the_block(name):
    fp = FastPipeline(make_pipeline(name))
    with pytest.raises(UnsupportedModelError, match="Block.* modulates its input"):
        fp.accelerate("blockcache(mode=teacache)")
    assert fp.accelerators == ()


def computed_and_changes(fp, spec: str | None, steps: int = 8) -> tuple[list[int], list[float]]:
    """One call of ``fp`` under ``spec`` (None: none): the steps whose blocks ran (the last block's attention
    computed) and, per step after the first, the relative L1 change of the first block's modulated input
    (SD3's ``norm1``, computed here from the block's inputs on every step, skipped or not)."""
    blocks = fp.denoiser.transformer_blocks
    modulated, computed = {}, []

    def on_first(module, args, kwargs):  # a torch pre-hook: runs whether or not blockcache skips the block
        modulated[fp.context.step] = module.norm1(kwargs["hidden_states"], emb=kwargs["temb"])[0]

    hooks = [
        blocks[0].register_forward_pre_hook(on_first, with_kwargs=True),
        blocks[-1].attn.to_q.register_forward_pre_hook(lambda *_: computed.append(fp.context.step)),
    ]
    handle = fp.accelerate(spec) if spec else None
    try:
        call(fp.pipe, fp, steps=steps)
    finally:
        if handle is not None:
            handle.remove()
        for hook in hooks:
            hook.remove()
    changes = [
        ((modulated[k] - modulated[k - 1]).abs().mean() / modulated[k - 1].abs().mean()).item()
        for k in range(1, steps)
    ]
    return computed, changes


def teacache_prediction(changes: list[float], rescale, threshold: float) -> list[int]:
    """The steps TeaCache computes: the first and the last, and each step where the rescaled changes summed since
    the last computed step reach ``threshold``."""
    computed, total = [0], 0.0
    for step, change in enumerate(changes, start=1):
        total += float(rescale(change))
        if total >= threshold or step == len(changes):
            computed.append(step)
            total = 0.0
    return computed


def test_fit_teacache_command_fits_at_the_guidance_asked_and_its_fit_decides_the_skipped_steps(tmp_path):
    from fastdiff.cli.main import main

    pipe = make_pipeline("tiny-sd3")
    pipe.save_pretrained(tmp_path / "model")
    fits = {}
    for guidance in (1.0, 5.0):
        out = tmp_path / f"fit-{guidance}.json"
        main(
            [
                "fit-teacache",
                str(tmp_path / "model"),
                "--steps",
                "8",
                "--calls",
                "1",
                "--batch",
                "1",
                "--guidance",
                str(guidance),
                "--out",
                str(out),
            ]
        )
        fits[guidance] = json.loads(out.read_text())
    low, high = fits[1.0], fits[5.0]
    assert low["model"] == "SD3Transformer2DModel" and low["points"] == 7 and len(low["coefficients"]) == 5
    assert np.isfinite(low["rms_error"]) and low["coefficients"] != high["coefficients"]  # guidance reached the calls
    # a results record: the command that made it, every deciding option included, and the run's provenance
    assert high["command"] == (
        f"fastdiff fit-teacache {tmp_path / 'model'} --size bench --steps 8 --calls 1 --degree 4 --batch 1 "
        f"--guidance 5.0 --out {tmp_path / 'fit-5.0.json'}"
    )
    assert high["benchmark"] == "fit_teacache" and high["commit"] and high["date"] and "start" in high["load"]
    constant = tmp_path / "constant.json"  # a rescaling that ignores the change: 0.2 a step
    constant.write_text(json.dumps({"model": "SD3Transformer2DModel", "coefficients": [0.2]}))
    fp = FastPipeline.from_pretrained(tmp_path / "model")
    fp.set_progress_bar_config(disable=True)
    threshold = 0.5  # on these 8 steps the summed changes stay >= 0.017 from it, fitted or not
    plain, _ = computed_and_changes(fp, None)
    assert plain == list(range(8))
    runs = {}
    for name, fit, rescale in (
        ("none", None, np.poly1d([1.0, 0.0])),  # no fit: the change as it is
        ("fit", tmp_path / "fit-5.0.json", np.poly1d(high["coefficients"])),
        ("constant", constant, np.poly1d([0.2])),
    ):
        spec = f"blockcache(mode=teacache,threshold={threshold}" + (f",fit={fit})" if fit else ")")
        computed, changes = computed_and_changes(fp, spec)
        # the steps its rescaling predicts from the changes the call saw
        assert computed == teacache_prediction(changes, rescale, threshold), name
        runs[name] = computed
    # the tiny model's raw changes (about 0.04 a step) never sum to 0.5; its fit rescales them to 0.26-0.46
    assert runs["none"] == [0, 7] and runs["fit"] == [0, 2, 4, 6, 7]
    assert runs["constant"] == [0, 3, 6, 7]  # 0.2, 0.4, then 0.6 >= 0.5: every third step


def test_relative_change_is_the_ratio_of_mean_absolute_values_and_follows_tensor_division_at_zero():
    g = torch.Generator().manual_seed(0)
    now, before = torch.randn(4, 64, 32, generator=g), torch.randn(4, 64, 32, generator=g)
    means = ((now - before).abs().mean() / before.abs().mean()).item()  # the definition (diffusers' first-block)
    assert relative_change(now, before) == pytest.approx(means, rel=1e-6)
    zero = torch.zeros(2, 3)
    assert relative_change(torch.ones(2, 3), zero) == float("inf")  # as 6.0 / torch.tensor(0.0)
    assert np.isnan(relative_change(zero, zero))  # 0 / 0: never below a threshold, so the blocks run
    half = torch.full((1, 4096, 64), 8.0, dtype=torch.float16)  # its sum, 2 million, is beyond float16's range
    assert relative_change(half * 1.5, half) == 0.5
