"""digits-sd: the text-conditional digits reference in the StableDiffusionPipeline class (prompts, the
fixed-step build, scoring through bench with the prompt's digit as label, the shipped hash-checked copy)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from diffusers import StableDiffusionPipeline

from fastdiff.eval.bench import make_inputs, run_bench
from fastdiff.eval.quality import model_prompts
from fastdiff.zoo import build
from fastdiff.zoo.digit_captions import DIGIT_WORDS, bench_prompts, digit_of, stroke_words, training_prompts
from fastdiff.zoo.evaluators import digits_sd_quality
from fastdiff.zoo.reference_sd import build_reference_sd
from fastdiff.zoo.shipped import SHIPPED_SD, ShippedModelError, install, is_installed, shipped_table


def test_digit_of_reads_numerals_and_words_and_refuses_ambiguous_prompts():
    assert digit_of("a handwritten seven") == 7 and digit_of("the digit 0") == 0
    assert digit_of("number NINE, thick strokes") == 9
    for bad in ("a handwritten cat", "the digits 3 and four", ""):
        with pytest.raises(ValueError, match="exactly one digit"):
            digit_of(bad)


def test_bench_prompts_cycle_through_every_digit_evenly():
    labels = [digit_of(p) for p in bench_prompts()]
    assert labels[:10] == list(range(10)) and np.bincount(labels).tolist() == [len(labels) // 10] * 10


def test_every_image_gets_every_template_naming_its_digit_and_its_strokes():
    """Equal prompt sets per image: guidance must not tilt the samples toward some images of a digit."""
    rng = np.random.default_rng(0)
    images = rng.random((30, 1, 16, 16)).astype(np.float32) * np.linspace(0.1, 1, 30)[:, None, None, None]
    labels = np.arange(30) % 10
    strokes = stroke_words(images)
    assert strokes[0] == "thin" and strokes[15] == "medium" and strokes[-1] == "thick"
    prompts, allowed = training_prompts(labels, strokes)
    assert prompts[0] == "" and allowed.min() >= 1  # the unconditional prompt comes only from dropout
    for label, stroke, ids in zip(labels, strokes, allowed):
        named = [prompts[i] for i in ids]
        assert all(digit_of(p) == label for p in named) and sum(stroke in p for p in named) == 3
    assert not any(w in p for p in bench_prompts() for w in ("thin", "medium", "thick"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_reference_sd(
        tmp_path_factory.mktemp("digits-sd"), vae_steps=2, unet_steps=2, threads=1, progress=False
    )


def test_toy_build_is_a_stable_diffusion_pipeline_scored_by_bench(toy):
    pipe = StableDiffusionPipeline.from_pretrained(toy)
    assert pipe.vae.config.in_channels == 1 and pipe.unet.config.sample_size == 8
    assert model_prompts(pipe) == bench_prompts()
    inputs = make_inputs(pipe, batch=12, guidance=5.0)
    assert inputs["prompt"][:10] == bench_prompts()[:10]
    result = run_bench(
        toy, [("dpm 3", "scheduler(name=dpm++2m,steps=3)")], steps=None, runs=1, batch=20, guidance=5.0, warmup=False
    )
    row = result["configs"][0]
    assert 0.0 <= row["accuracy"] <= 1.0 and row["fd"] > 0 and row["fd_floor"] > 0
    report = json.loads((toy / "eval" / "report.json").read_text())
    assert report["vae"]["steps"] == 2 and report["text_unet"]["steps"] == 2 and report["scaling_factor"] > 0


def test_quality_is_empty_for_sd_models_without_digit_prompts_and_checks_counts(toy):
    pipe = StableDiffusionPipeline.from_pretrained(toy)
    images = np.zeros((2, 16, 16, 1), np.float32)
    with pytest.raises(ValueError, match="one image per prompt"):
        digits_sd_quality(pipe, {"prompt": ["a handwritten one"]}, images)
    from fastdiff.zoo.tiny import make_tiny_sd

    assert digits_sd_quality(make_tiny_sd("test"), {"prompt": ["a cat", "a dog"]}, images) == {}


def test_bad_step_counts_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unet_steps must be a positive integer"):
        build_reference_sd(tmp_path, vae_steps=2, unet_steps=0)


@pytest.mark.skipif(not SHIPPED_SD, reason="no digits-sd shipped in this checkout")
def test_shipped_digits_sd_installs_checked_and_refuses_damage(tmp_path):
    from fastdiff.zoo.shipped import DATA_DIR_SD

    assert shipped_table(DATA_DIR_SD, "digits-sd") == SHIPPED_SD
    out = build("digits-sd", tmp_path / "ok", size="bench")
    assert is_installed(out, "digits-sd")
    pipe = StableDiffusionPipeline.from_pretrained(out)
    assert pipe.tokenizer("a handwritten seven").input_ids[-2] != pipe.tokenizer("a handwritten one").input_ids[-2]
    damaged = tmp_path / "damaged"
    install(damaged, "digits-sd")
    weights = damaged / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert not is_installed(damaged, "digits-sd")
    with pytest.raises(ShippedModelError, match="truncated or corrupt"):
        install(tmp_path / "copy", "digits-sd", source=damaged)
    assert DIGIT_WORDS[7] == "seven"
