"""Tests of the tiny flow-matching transformer zoo: build, save, reload offline, generate; the tokenizers."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before diffusers is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
)
from helpers import assert_plausible_images, in_fresh_memory, saved_zoo_pipelines  # noqa: E402

from fastdiff.zoo import build  # noqa: E402
from fastdiff.zoo import text_encoders as te  # noqa: E402
from fastdiff.zoo.tiny_flow import FLOW_MAKERS, make_flow_pipeline  # noqa: E402

MODELS = list(FLOW_MAKERS)
PROMPT = "a photo of a cat riding a horse on mars"
# Each pipeline's way of classifier-free guidance, on at its default scale unless turned off here.
NO_GUIDANCE = {
    "tiny-flux": {},
    "tiny-flux-schnell": {},
    "tiny-flux2": {},  # guidance-distilled / no CFG
    "tiny-flux2-klein": dict(guidance_scale=1.0),
    "tiny-sd3": dict(guidance_scale=1.0),
    "tiny-sana": dict(guidance_scale=1.0),
    "tiny-pixart-sigma": dict(guidance_scale=1.0),
    "tiny-qwen-image": dict(true_cfg_scale=1.0),
    "tiny-zimage": dict(guidance_scale=1.0),
}


def generate(pipe, name: str, seed: int = 0, **kwargs) -> np.ndarray:
    """Two steps at 32px with a seeded generator and the pipeline's default guidance."""
    kwargs = dict(
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(seed),
        height=32,
        width=32,
        **kwargs,
    )
    if name in ("tiny-sana", "tiny-pixart-sigma"):
        kwargs.update(use_resolution_binning=False, clean_caption=False)
    if name == "tiny-qwen-image" and "true_cfg_scale" not in kwargs:
        kwargs["negative_prompt"] = "blurry"  # Qwen-Image runs true CFG only with a negative prompt
    return pipe(prompt=PROMPT, **kwargs).images


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """For each model: (in-memory pipeline, directory ``fastdiff.zoo.build`` wrote)."""
    return saved_zoo_pipelines(tmp_path_factory, MODELS, make_flow_pipeline)


@pytest.fixture(scope="module")
def outputs(saved):
    return {name: generate(pipe, name) for name, (pipe, _) in saved.items()}


@pytest.mark.parametrize("name", MODELS)
def test_reloaded_pipeline_generates_the_same_images(name, saved, outputs):
    in_memory, directory = saved[name]
    assert not list(directory.rglob("*.bin")), "weights must be saved as safetensors"
    reloaded = DiffusionPipeline.from_pretrained(directory)
    reloaded.set_progress_bar_config(disable=True)
    assert type(reloaded) is type(in_memory)
    assert type(reloaded.scheduler) is type(in_memory.scheduler)
    public = [
        {k: v for k, v in s.config.items() if not k.startswith("_")} for s in (reloaded.scheduler, in_memory.scheduler)
    ]
    assert public[0] == public[1]

    expected = outputs[name]
    assert_plausible_images(expected)
    assert np.array_equal(generate(in_fresh_memory(reloaded), name), expected)


@pytest.mark.parametrize("name", MODELS)
def test_seeds_and_guidance(name, saved, outputs):
    pipe = saved[name][0]
    assert np.array_equal(generate(pipe, name), outputs[name]), "same seed, same image"
    assert not np.array_equal(generate(pipe, name, seed=1), outputs[name])
    if NO_GUIDANCE[name]:
        unguided = generate(pipe, name, **NO_GUIDANCE[name])
        assert np.isfinite(unguided).all() and not np.array_equal(unguided, outputs[name])


def test_same_seed_same_weights_other_seed_other_weights(saved):
    again, other = make_flow_pipeline("tiny-flux", "test", 0), make_flow_pipeline("tiny-flux", "test", 1)
    first = saved["tiny-flux"][0]
    weights = [next(iter(pipe.transformer.parameters())) for pipe in (first, again, other)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_families_keep_their_schedulers(saved):
    flux, schnell = saved["tiny-flux"][0].scheduler.config, saved["tiny-flux-schnell"][0].scheduler.config
    assert flux.use_dynamic_shifting and (flux.base_shift, flux.max_shift, flux.shift) == (0.5, 1.15, 3.0)
    assert (flux.base_image_seq_len, flux.max_image_seq_len) == (256, 4096)
    assert not schnell.use_dynamic_shifting and schnell.shift == 1.0
    assert saved["tiny-sd3"][0].scheduler.config.shift == 3.0
    qwen = saved["tiny-qwen-image"][0].scheduler.config
    assert qwen.time_shift_type == "exponential" and qwen.max_image_seq_len == 8192 and qwen.shift_terminal == 0.02
    for name in ("tiny-flux", "tiny-flux2", "tiny-flux2-klein", "tiny-sd3", "tiny-qwen-image", "tiny-zimage"):
        assert isinstance(saved[name][0].scheduler, FlowMatchEulerDiscreteScheduler)
    sana, pixart = saved["tiny-sana"][0].scheduler, saved["tiny-pixart-sigma"][0].scheduler
    assert isinstance(sana, DPMSolverMultistepScheduler) and isinstance(pixart, DPMSolverMultistepScheduler)
    assert sana.config.prediction_type == "flow_prediction" and sana.config.use_flow_sigmas
    assert sana.config.flow_shift == 3.0
    assert pixart.config.prediction_type == "epsilon" and not pixart.config.use_flow_sigmas
    assert saved["tiny-flux"][0].transformer.config.guidance_embeds
    assert not saved["tiny-flux-schnell"][0].transformer.config.guidance_embeds


@pytest.mark.parametrize(
    "make", [te.make_t5_tokenizer, te.make_gemma_tokenizer, te.make_qwen_tokenizer, te.make_mistral_tokenizer]
)
def test_tokenizers_round_trip(make, tmp_path):
    tokenizer = make()
    ids = tokenizer(PROMPT).input_ids
    words = len(PROMPT.split())
    assert words <= len(ids) <= words + 2, "every common word is one token (plus bos / eos)"
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    odd = "Zqx 42 waffles!"
    assert tokenizer.decode(tokenizer(odd).input_ids, skip_special_tokens=True).replace(" ", "") == "Zqx42waffles!"
    tokenizer.save_pretrained(tmp_path)
    reloaded = type(tokenizer).from_pretrained(tmp_path)
    assert reloaded(PROMPT).input_ids == ids and len(reloaded) == len(tokenizer)


def test_chat_templates_and_qwen_image_prefix():
    qwen = te.make_qwen_tokenizer(vision=True)
    messages = [{"role": "user", "content": "a cat"}]
    text = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    pipe_template = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"  # noqa: E501
    assert len(qwen(pipe_template).input_ids) == 34, "QwenImagePipeline drops exactly 34 template tokens"
    mistral = te.make_mistral_tokenizer()
    system = [{"role": "system", "content": [{"type": "text", "text": "You are an AI"}]}]
    text = mistral.apply_chat_template(system + messages, tokenize=False)
    assert text == "<s>[SYSTEM_PROMPT]You are an AI[/SYSTEM_PROMPT][INST]a cat[/INST]"


def test_text_encoders_match_their_tokenizers(saved):
    for name, tokenizer, encoder in [
        ("tiny-flux", "tokenizer_2", "text_encoder_2"),
        ("tiny-sd3", "tokenizer_3", "text_encoder_3"),
        ("tiny-pixart-sigma", "tokenizer", "text_encoder"),
        ("tiny-sana", "tokenizer", "text_encoder"),
        ("tiny-zimage", "tokenizer", "text_encoder"),
        ("tiny-flux2-klein", "tokenizer", "text_encoder"),
    ]:
        pipe = saved[name][0]
        assert len(getattr(pipe, tokenizer)) == getattr(pipe, encoder).config.vocab_size, name
    qwen = saved["tiny-qwen-image"][0]
    assert len(qwen.tokenizer) == qwen.text_encoder.config.text_config.vocab_size
    flux2 = saved["tiny-flux2"][0]
    assert len(flux2.tokenizer) == flux2.text_encoder.config.text_config.vocab_size
    assert flux2.text_encoder.config.text_config.num_hidden_layers >= 30  # hidden states 10, 20, 30


def test_unknown_model_or_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tiny-flux"):
        make_flow_pipeline("nope")
    with pytest.raises(ValueError, match="test, bench"):
        build("tiny-flux", tmp_path, size="huge")
    with pytest.raises(ValueError, match="test, bench"):
        make_flow_pipeline("tiny-sd3", "huge")


def test_padding_sides_survive_reload(saved):
    flux2 = saved["tiny-flux2"][1]
    assert DiffusionPipeline.from_pretrained(flux2).tokenizer.padding_side == "left"


@pytest.mark.parametrize("name", MODELS)
def test_size_factor_is_a_size_the_pipeline_takes_as_is(name):
    """``FastPipeline.size_factor`` includes what diffusers' own input checks require (Sana 32 px, Flux's
    2x2 latent packing), so a size it allows is generated at exactly that size and one it refuses is refused
    before any model work, never resized (Flux, Qwen-Image) or failed inside the pipeline (Sana, PixArt)."""
    from fastdiff import FastPipeline
    from fastdiff.core.calls import CallArgumentError

    fp = FastPipeline(make_flow_pipeline(name))
    factor = fp.size_factor()
    side = factor * max(1, 32 // factor)
    kwargs = dict(num_inference_steps=2, output_type="np", height=side, width=side + factor)
    if name in ("tiny-sana", "tiny-pixart-sigma"):
        kwargs.update(use_resolution_binning=False, clean_caption=False)
    images = fp(prompt=PROMPT, **kwargs).images
    assert images.shape[1:3] == (side, side + factor), (factor, images.shape)
    with pytest.raises(CallArgumentError, match=f"a positive multiple of {factor}"):
        fp(prompt=PROMPT, **{**kwargs, "width": side + factor // 2})


def test_guidance_to_a_model_that_ignores_it_is_refused():
    """FLUX.1-schnell has no guidance input: diffusers drops guidance_scale silently, fastdiff refuses a value
    asking for guidance (> 1) and takes the documented guidance_scale=0; Flux-dev-style takes any value."""
    from fastdiff import FastPipeline
    from fastdiff.core.calls import CallArgumentError

    call = dict(prompt=PROMPT, num_inference_steps=1, output_type="np", height=32, width=32)
    schnell = FastPipeline(make_flow_pipeline("tiny-flux-schnell"))
    with pytest.raises(CallArgumentError, match="guidance_embeds=False.*true_cfg_scale") as refused:
        schnell(**call, guidance_scale=7.0)
    assert refused.value.argument == "guidance_scale" and refused.value.value == 7.0
    assert np.isfinite(schnell(**call, guidance_scale=0.0).images).all()
    dev = FastPipeline(make_flow_pipeline("tiny-flux"))
    assert dev.denoiser.config.guidance_embeds
    assert np.isfinite(dev(**call, guidance_scale=7.0).images).all()


def test_one_step_on_a_terminal_shift_scheduler_is_refused():
    """Qwen-Image's scheduler stretches its sigmas to shift_terminal: with one sigma diffusers divides 0 by 0 and
    the images are NaN; fastdiff refuses the step count before any model work. Two steps are fine."""
    from fastdiff import FastPipeline
    from fastdiff.core.calls import CallArgumentError

    fp = FastPipeline(make_flow_pipeline("tiny-qwen-image"))
    assert fp.pipe.scheduler.config.shift_terminal
    call = dict(prompt=PROMPT, output_type="np", height=32, width=32)
    with pytest.raises(CallArgumentError, match="at least 2.*shift_terminal"):
        fp(**call, num_inference_steps=1)
    assert np.isfinite(fp(**call, num_inference_steps=2).images).all()


def test_separate_call_guidance_is_known_before_the_call(saved):
    """The facts say before a call whether it runs guidance as separate denoiser calls per step (true CFG),
    so accelerators that cannot serve it refuse before any model work; checked against the calls the
    pipelines really make, with and without the arguments that switch it on."""
    from fastdiff import FastPipeline
    from fastdiff.core.models import separate_cfg

    cases = {
        "tiny-flux": [{}, dict(negative_prompt="blur", true_cfg_scale=3.0), dict(true_cfg_scale=3.0)],
        "tiny-qwen-image": [
            {},
            dict(negative_prompt="blur"),
            dict(negative_prompt="blur", true_cfg_scale=1.0),
        ],
        "tiny-flux2-klein": [{}, dict(guidance_scale=1.0)],
        "tiny-sd3": [{}],  # batched guidance: one call per step
    }
    seen = set()
    for name, calls in cases.items():
        fp = FastPipeline(saved[name][0])
        for extra in calls:
            kwargs = dict(prompt=PROMPT, num_inference_steps=2, output_type="np", height=32, width=32, **extra)
            fp(**kwargs)
            separate = fp.context.denoiser_calls == 4
            assert separate_cfg(fp.pipe, kwargs) == separate, (name, extra)
            seen.add(separate)
        fp.unwrap()
    assert seen == {True, False}


def test_a_reused_call_gives_the_same_images_on_zimage(saved):
    """diffusers' Z-Image pipelines write the chat template into the caller's prompt list, so calling the pipeline
    twice with one argument dict templates the prompt twice; FastPipeline hands the pipeline a copy."""
    from fastdiff import FastPipeline

    pipe = saved["tiny-zimage"][0]
    call = dict(prompt=[PROMPT], num_inference_steps=2, output_type="np", height=32, width=32)
    first = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    assert call["prompt"] != [PROMPT]  # the upstream behaviour this guards against
    call["prompt"] = [PROMPT]
    fp = FastPipeline(pipe)
    try:
        images = [fp(**call, generator=torch.Generator().manual_seed(0)).images for _ in range(2)]
    finally:
        fp.unwrap()
    assert call["prompt"] == [PROMPT]
    np.testing.assert_array_equal(images[0], first)
    np.testing.assert_array_equal(images[1], first)
