"""digits-flow: the SD3-shaped (MMDiT, flow-matching) digits reference (the compressed-context training is the
pipeline's 256-zero-token context exactly, the toy build reloads and generates, resume replays a straight run)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline, StableDiffusion3Pipeline
from safetensors.torch import load_file

from fastdiff.eval.quality import model_prompts
from fastdiff.zoo import ZOO, available, build
from fastdiff.zoo.digit_captions import bench_prompts
from fastdiff.zoo.evaluators import digits_sd_quality
from fastdiff.zoo.reference_flow import (
    DEFAULT_GUIDANCE,
    MAX_SEQUENCE_LENGTH,
    MultiplicityJointAttnProcessor,
    build_reference_flow,
    load_flow_pipeline,
    null_components,
)
from fastdiff.zoo.shipped import SHIPPED_FLOW, ShippedModelError, install, is_installed, shipped_table


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_reference_flow(tmp_path_factory.mktemp("digits-flow"), steps=4, threads=1, progress=False)


@pytest.fixture(scope="module")
def pipe(toy):
    return DiffusionPipeline.from_pretrained(str(toy), **null_components(toy))


def test_toy_build_reloads_as_an_sd3_pipeline_without_t5_and_generates_finite_digits(toy, pipe):
    assert isinstance(pipe, StableDiffusion3Pipeline)
    assert {"text_encoder_3", "tokenizer_3"} <= set(null_components(toy))
    assert pipe.text_encoder_3 is None and pipe.transformer.config.joint_attention_dim == 128
    assert pipe.vae.config.shift_factor is not None and pipe.vae.config.scaling_factor > 0
    eye = torch.eye(pipe.text_encoder.config.hidden_size)
    assert torch.equal(pipe.text_encoder.text_projection.weight, eye)
    assert torch.equal(pipe.text_encoder_2.text_projection.weight, eye)
    pipe.set_progress_bar_config(disable=True)
    images = pipe(
        prompt=["a handwritten seven", "the digit 3"],
        num_inference_steps=2,
        guidance_scale=4.0,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (2, 16, 16, 1) and np.isfinite(images).all()
    assert model_prompts(pipe) == bench_prompts()
    scores = digits_sd_quality(
        pipe, {"prompt": ["a handwritten seven", "the digit 3"] * 5}, np.concatenate([images] * 5)
    )
    assert 0.0 <= scores["accuracy"] <= 1.0 and scores["fd"] > 0 and scores["fd_floor"] > 0
    report = json.loads((toy / "eval" / "report.json").read_text())
    assert report["kind"] == "digits-flow" and report["transformer"]["steps"] == 4
    assert report["max_sequence_length"] == MAX_SEQUENCE_LENGTH


def test_bench_and_server_use_the_models_own_guidance(toy):
    """eval/prompts.json records the guidance digits-flow is benchmarked at; `fastdiff bench` and the server's
    default take it instead of the SD3 pipeline's own default (7.0); an explicit value still wins."""
    from fastdiff import FastPipeline
    from fastdiff.core.inputs import make_inputs
    from fastdiff.serving.engine import Engine

    pipe = DiffusionPipeline.from_pretrained(str(toy), **null_components(toy))  # not the shared one: hooks stay
    assert make_inputs(pipe, 2)["guidance_scale"] == DEFAULT_GUIDANCE != 7.0
    assert make_inputs(pipe, 2, guidance=1.5)["guidance_scale"] == 1.5
    assert Engine(FastPipeline(pipe), {}).default_guidance == DEFAULT_GUIDANCE


def test_training_context_is_the_pipelines_256_zero_tokens_exactly(pipe):
    """One zero token counted 256 times (the training processor) = the 256 zero "T5" tokens the pipeline appends."""
    prompts = ["a handwritten seven", ""]
    with torch.no_grad():
        full, _, pooled, _ = pipe.encode_prompt(prompts, None, None, do_classifier_free_guidance=False)
        short, _, pooled_short, _ = pipe.encode_prompt(
            prompts, None, None, do_classifier_free_guidance=False, max_sequence_length=1
        )
    assert full.shape[1] == 16 + MAX_SEQUENCE_LENGTH and torch.equal(full[:, :17], short)
    assert torch.equal(pooled, pooled_short) and not full[:, 16:].any()
    transformer = copy.deepcopy(pipe.transformer)
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([900.0, 200.0])
    with torch.no_grad():
        for p in transformer.parameters():  # perturbed, so that no zero-initialised part hides a difference
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        kwargs = dict(hidden_states=latents, timestep=t, pooled_projections=pooled, return_dict=False)
        expected = transformer(encoder_hidden_states=full, **kwargs)[0]
        stock = transformer(encoder_hidden_states=short, **kwargs)[0]
        transformer.set_attn_processor(MultiplicityJointAttnProcessor(MAX_SEQUENCE_LENGTH))
        counted = transformer(encoder_hidden_states=short, **kwargs)[0]
    assert torch.allclose(counted, expected, atol=1e-5)
    assert not torch.allclose(stock, expected, atol=1e-3)  # the count matters: one plain zero token differs


def test_resume_replays_a_straight_run(tmp_path):
    straight = build_reference_flow(tmp_path / "straight", steps=4, threads=1, progress=False)
    assert build_reference_flow(tmp_path / "split", steps=4, threads=1, progress=False, stop_after=2) is None
    assert not (tmp_path / "split" / "model_index.json").exists()
    resumed = build_reference_flow(tmp_path / "split", steps=4, threads=1, progress=False, resume=True)
    name = "transformer/diffusion_pytorch_model.safetensors"
    a, b = load_file(straight / name), load_file(resumed / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((resumed / "eval" / "report.json").read_text())["transformer"]
    assert report["resumed_from"] == 2 and report["steps"] == 4


def test_registered_in_the_zoo_and_bad_steps_refused(tmp_path):
    assert "digits-flow" in available() and ZOO["digits-flow"][1] == ("test", "bench")
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        build_reference_flow(tmp_path, steps=0)


@pytest.mark.skipif(not SHIPPED_FLOW, reason="no digits-flow shipped in this checkout")
def test_shipped_digits_flow_installs_checked_draws_the_digits_asked_for_and_refuses_damage(tmp_path):
    from fastdiff.zoo.shipped import DATA_DIR_FLOW

    assert shipped_table(DATA_DIR_FLOW, "digits-flow") == SHIPPED_FLOW
    out = build("digits-flow", tmp_path / "ok", size="bench")
    assert is_installed(out, "digits-flow") and (out / "eval" / "classifier.pt").is_file()
    pipe = load_flow_pipeline(out)
    pipe.set_progress_bar_config(disable=True)
    prompts = bench_prompts()[:10] * 2
    images = pipe(
        prompt=prompts,
        num_inference_steps=10,
        guidance_scale=DEFAULT_GUIDANCE,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    scores = digits_sd_quality(pipe, {"prompt": prompts}, images)
    assert scores["accuracy"] >= 0.8, scores  # trained weights: the digit each prompt names
    weights = out / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert not is_installed(out, "digits-flow")
    with pytest.raises(ShippedModelError, match="truncated or corrupt"):
        install(tmp_path / "copy", "digits-flow", source=out)
