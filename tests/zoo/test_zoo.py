"""Tests of the tiny model zoo: build, save, reload offline, generate, and the generated tokenizer."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before diffusers is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import assert_plausible_images, in_fresh_memory, saved_zoo_pipelines  # noqa: E402
from transformers import CLIPTokenizer  # noqa: E402

from fastdiff import load_pipeline
from fastdiff.zoo import build  # noqa: E402
from fastdiff.zoo.tiny import PIPELINE_MAKERS, make_pipeline, make_tiny_sd  # noqa: E402
from fastdiff.zoo.tokenizer import COMMON_WORDS, make_clip_tokenizer, write_vocab_files  # noqa: E402

MODELS = ["tiny-sd", "tiny-sdxl", "tiny-dit", "tiny-ddpm"]
PROMPT = "a photo of a cat riding a horse on mars"


def generate(pipe, name: str, guidance_scale: float | None = None, seed: int = 0) -> np.ndarray:
    """Two denoising steps with a seeded generator; guidance None means the pipeline's usual CFG."""
    kwargs = dict(num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(seed))
    if name == "tiny-ddpm":
        return pipe(**kwargs).images
    if name == "tiny-dit":
        return pipe(class_labels=[3], guidance_scale=guidance_scale or 4.0, **kwargs).images
    return pipe(PROMPT, guidance_scale=guidance_scale or 7.5, **kwargs).images


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """For each model: (in-memory pipeline, directory its registered builder wrote)."""
    return saved_zoo_pipelines(tmp_path_factory, MODELS, make_pipeline)


@pytest.fixture(scope="module")
def reloaded(saved):
    pipelines = {}
    for name, (_, directory) in saved.items():
        pipe = load_pipeline(directory)
        pipe.set_progress_bar_config(disable=True)
        pipelines[name] = pipe
    return pipelines


@pytest.mark.parametrize("name", MODELS)
def test_reloaded_pipeline_generates_the_same_images(name, saved, reloaded):
    in_memory, directory = saved[name]
    assert (directory / "model_index.json").exists()
    assert not list(directory.rglob("*.bin")), "weights must be saved as safetensors"
    assert type(reloaded[name]) is type(in_memory)

    expected = generate(in_memory, name)
    assert_plausible_images(expected)

    as_loaded = generate(reloaded[name], name)
    np.testing.assert_allclose(as_loaded, expected, atol=1e-5, rtol=0)
    assert np.array_equal(generate(in_fresh_memory(reloaded[name]), name), expected)


@pytest.mark.parametrize("name, guidance_scales", [("tiny-sd", (1.0, 7.5)), ("tiny-sdxl", (1.0, 7.5))])
def test_text_to_image_with_and_without_guidance(name, guidance_scales, saved):
    pipe = saved[name][0]
    without_cfg, with_cfg = (generate(pipe, name, guidance_scale=scale) for scale in guidance_scales)
    for images in (without_cfg, with_cfg):
        assert images.shape == (1, 32, 32, 3)
        assert np.isfinite(images).all() and images.min() >= 0.0 and images.max() <= 1.0
    assert not np.array_equal(without_cfg, with_cfg)
    assert np.array_equal(generate(pipe, name, guidance_scale=1.0), without_cfg)  # same seed, same image


def test_dit_with_and_without_guidance(saved):
    pipe = saved["tiny-dit"][0]
    without_cfg, with_cfg = generate(pipe, "tiny-dit", 1.0), generate(pipe, "tiny-dit", 4.0)
    assert np.isfinite(without_cfg).all() and np.isfinite(with_cfg).all()
    assert not np.array_equal(without_cfg, with_cfg)
    assert pipe.transformer.config.num_embeds_ada_norm == 1000  # DiTPipeline's null class is label 1000
    assert pipe.get_label_ids(["cat", "truck"]) == [3, 9]


def test_dit_labels_survive_reload(reloaded):
    assert reloaded["tiny-dit"].get_label_ids(["cat"]) == [3]


def test_tokenizer_round_trips_and_matches_text_encoders(saved, reloaded):
    tokenizer = make_clip_tokenizer()
    ids = tokenizer(PROMPT).input_ids
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert len(ids) == len(PROMPT.split()) + 2, "every common word is one token"
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    assert tokenizer.decode(tokenizer("Zqx 42 waffles!").input_ids, skip_special_tokens=True) == "zqx 4 2 waffles !"
    assert tokenizer.model_max_length == 77

    sd, sdxl = saved["tiny-sd"][0], saved["tiny-sdxl"][0]
    for tok, encoder in [
        (sd.tokenizer, sd.text_encoder),
        (sdxl.tokenizer, sdxl.text_encoder),
        (sdxl.tokenizer_2, sdxl.text_encoder_2),
    ]:
        assert len(tok) == encoder.config.vocab_size
        assert tok.eos_token_id == encoder.config.eos_token_id

    padded = dict(padding="max_length", max_length=77, truncation=True)
    for name in ("tiny-sd", "tiny-sdxl"):
        after_reload = reloaded[name].tokenizer
        assert after_reload.model_max_length == 77
        assert after_reload(PROMPT, **padded).input_ids == tokenizer(PROMPT, **padded).input_ids


def test_vocab_files_build_the_same_tokenizer(tmp_path):
    vocab_file, merges_file = write_vocab_files(tmp_path)
    from_files = CLIPTokenizer(vocab=str(vocab_file), merges=str(merges_file))
    in_memory = make_clip_tokenizer()
    assert len(from_files) == len(in_memory) > 2 * 256 + len(set(COMMON_WORDS.split())) // 2
    assert from_files(PROMPT).input_ids == in_memory(PROMPT).input_ids


def test_same_seed_same_weights_other_seed_other_weights():
    first, again, other = (make_pipeline("tiny-ddpm", "test", seed) for seed in (0, 0, 1))
    weights = [next(iter(pipe.unet.parameters())) for pipe in (first, again, other)]
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], weights[2])


def test_unknown_model_or_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tiny-sd"):
        build("nope", tmp_path)
    with pytest.raises(ValueError, match="test, bench"):
        build("tiny-sd", tmp_path, size="huge")
    with pytest.raises(ValueError, match="test, bench"):
        make_tiny_sd("huge")
    with pytest.raises(ValueError, match="tiny-ddpm"):
        make_pipeline("nope")
    assert set(MODELS) <= set(PIPELINE_MAKERS)


def test_bench_sd_unet_has_about_35m_parameters():
    pipe = make_tiny_sd("bench", seed=0)
    parameters = sum(p.numel() for p in pipe.unet.parameters())
    assert 30e6 <= parameters <= 40e6
    assert pipe.unet.config.sample_size * pipe.vae_scale_factor == 256


def test_class_conditional_pipeline_passes_latents_to_the_step_callback(tmp_path):
    """The callback gets the latents it asks for and may replace them (diffusers' convention)."""
    pipe = load_pipeline(build("digits", tmp_path / "digits", size="bench"))  # shipped
    pipe.set_progress_bar_config(disable=True)
    seen = []

    def callback(p, step, timestep, tensors):
        seen.append(tensors["latents"].shape)
        return {"latents": torch.zeros_like(tensors["latents"])} if step == 1 else {}

    out = pipe(
        [3, 7],
        num_inference_steps=2,
        output_type="np",
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["latents"],
    )
    assert len(seen) == 2 and seen[0][0] == 2
    np.testing.assert_allclose(out.images, 0.5, atol=1e-6)  # zero latents decode to mid-grey
