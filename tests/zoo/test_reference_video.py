"""moving-digits: the Wan-shaped video reference (clips and metrics read the real clips right, the compressed
training context is the pipeline's 512-token context exactly, a toy build reloads, generates and is scored,
resume replays a straight run, the shipped build installs checked and draws what is asked)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from safetensors.torch import load_file

from fastdiff.eval import quality_for
from fastdiff.eval.quality import load_reference_eval
from fastdiff.zoo import ZOO, available, build
from fastdiff.zoo import moving_digits as md
from fastdiff.zoo.reference_flow import load_flow_pipeline
from fastdiff.zoo.reference_video import (
    CONTEXT,
    VideoDenoiser,
    build_moving_digits,
    compressed_prompts,
)
from fastdiff.zoo.shipped import (
    DATA_DIR,
    SHIPPED_VIDEO,
    ShippedModelError,
    install,
    is_installed,
    shipped_table,
)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_moving_digits(
        tmp_path_factory.mktemp("moving-digits"), vae_steps=2, steps=3, threads=1, progress=False, images=12
    )


def test_clips_move_the_digit_edge_to_edge_and_the_metrics_read_real_clips():
    ref = load_reference_eval(DATA_DIR)
    clip = md.make_clip(ref.x_test[0, 0], "left")
    assert clip.shape == (md.FRAMES, md.CANVAS, md.CANVAS)
    assert np.array_equal(clip[0, 8:24, 16:32], ref.x_test[0, 0]) and np.array_equal(
        clip[-1, 8:24, :16], ref.x_test[0, 0]
    )
    real = md.video_metrics_real(ref.x_test[:60], ref.y_test[:60], ref)
    assert real["accuracy"] >= 0.97 and real["direction_accuracy"] == 1.0
    assert md.direction_of("the digit 7 moving up") == "up" and md.DIGIT_WORDS[7] == "seven"
    with pytest.raises(ValueError, match="exactly one direction"):
        md.direction_of("a seven moving left and right")
    clips, _ = md.make_clips(ref.x_test[:20])
    still = np.repeat(clips[:, :1], md.FRAMES, axis=1)  # no motion at all: temporal change 0
    assert md.temporal_change(still) == 0.0 < md.temporal_change(clips)
    assert len(md.bench_prompts()) == 80 and len(set(md.bench_prompts())) == 80


def test_floor_matches_the_prompts_clip_for_clip_and_the_ratio_carries_an_interval():
    from fastdiff.eval.floor import draw_rng, matched_draw
    from fastdiff.eval.quality import fd

    ref = load_reference_eval(DATA_DIR)
    # every digit in every direction, and digits 0-9 twice
    prompts = md.bench_prompts()[:40] + md.bench_prompts()[:10]
    digits = [md.digit_of(p) for p in prompts]
    clips = md.matched_real_clips(prompts, ref.x_train, ref.y_train, seed=3)
    idx, distinct = matched_draw(np.array(digits), ref.y_train, draw_rng(3, 0))
    # same count and mix: clip i is a distinct train image of prompt i's digit, moving prompt i's way
    assert distinct and len(set(idx.tolist())) == len(prompts) and list(ref.y_train[idx]) == digits
    expected = [md.make_clip(ref.x_train[i, 0], md.direction_of(p)) for i, p in zip(idx, prompts)]
    assert np.array_equal(clips, np.stack(expected))
    assert md.motion_directions(clips) == [md.direction_of(p) for p in prompts]
    other = md.matched_real_clips(prompts, ref.x_train, ref.y_train, seed=3, draw=1)
    assert not np.array_equal(clips, other)  # each draw is a new sample of the same mix
    # draw 0 of seed 4 is none of seed 3's draws (seed + draw made it seed 3's draw 1)
    assert not np.array_equal(md.matched_real_clips(prompts, ref.x_train, ref.y_train, seed=4), other)
    draws = md.clip_floor_draws(prompts, ref.x_train, ref.y_train, ref.classifier, seed=3, draws=3)
    assert [tuple(d.shape[:2]) for d in draws] == [(len(prompts), md.FRAMES)] * 3
    test = md.make_clips(ref.x_test[:60])[0]
    first = fd(md.digit_windows(clips), md.digit_windows(test), ref.classifier)
    scores = md.video_metrics(test[: len(prompts)], prompts, ref, test, seed=3, floor_draws=draws)
    # draw 0 is one of the three
    assert scores["fd_floor_low"] - 1e-3 <= first <= scores["fd_floor_high"] + 1e-3
    assert scores["fd_floor_low"] <= scores["fd_floor"] <= scores["fd_floor_high"]
    assert scores["fd_ratio"] == pytest.approx(scores["fd"] / scores["fd_floor"], rel=1e-4)
    assert scores["fd_ratio_low"] < scores["fd_ratio"] < scores["fd_ratio_high"]
    with pytest.raises(ValueError, match="at least 2 clips"):
        md.clip_floor_draws(prompts[:1], ref.x_train, ref.y_train, ref.classifier)
    with pytest.raises(ValueError, match="no real item of class"):
        matched_draw(np.array([3, 11]), ref.y_train, np.random.default_rng(0))


def test_training_context_is_the_pipelines_512_zero_tokens_exactly(toy):
    pipe = WanPipeline.from_pretrained(str(toy))
    prompts = ["a handwritten seven moving left", "", "digit 3 going up"]
    with torch.no_grad():
        full, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, max_sequence_length=CONTEXT)
    context, bias = compressed_prompts(pipe, prompts)
    assert full.shape[1] == CONTEXT and torch.allclose(full[:, : context.shape[1]], context, atol=1e-5)
    transformer = copy.deepcopy(pipe.transformer)
    latents = torch.randn(3, 8, 5, 8, 8, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([900.0, 400.0, 20.0])
    with torch.no_grad():
        for p in transformer.parameters():  # perturbed, so that no zero-initialised part hides a difference
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        expected = transformer(latents, t, full, return_dict=False)[0]
        stock = transformer(latents, t, context, return_dict=False)[0]
        denoiser = VideoDenoiser(transformer)
        denoiser.use_compressed_context()
        counted = denoiser(latents, t, context, bias)
    assert torch.allclose(counted, expected, atol=1e-5)
    assert not torch.allclose(stock, expected, atol=1e-3)  # the count matters


def test_toy_build_reloads_as_a_wan_pipeline_generates_clips_and_is_scored(toy):
    pipe = load_flow_pipeline(toy)
    assert isinstance(pipe, WanPipeline) and pipe.vae.config.scale_factor_temporal == 2
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a handwritten seven moving left", "the digit 3 moving up"] * 2
    frames = pipe(
        prompt=prompts,
        num_inference_steps=2,
        height=md.CANVAS,
        width=md.CANVAS,
        num_frames=md.FRAMES,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert frames.shape == (4, md.FRAMES, md.CANVAS, md.CANVAS, 3) and np.isfinite(frames).all()
    scores = quality_for(pipe)(pipe, {"prompt": prompts}, frames)
    assert set(scores) == {
        "accuracy",
        "direction_accuracy",
        "fd",
        "fd_floor",
        "fd_floor_low",
        "fd_floor_high",
        "fd_floor_draws",
        "fd_ratio",
        "fd_ratio_low",
        "fd_ratio_high",
        "temporal_change",
        "temporal_ratio",
    }
    # the toy draws noise: its clips match neither digit nor direction, far above the like-for-like floor
    assert scores["fd_ratio_low"] > 1
    toy_ref = load_reference_eval(toy)
    real = md.matched_real_clips(prompts, toy_ref.x_train, toy_ref.y_train, seed=0)
    real_frames = np.repeat(real[..., None], 3, -1)
    real_scores = quality_for(pipe)(pipe, {"prompt": prompts}, real_frames)
    assert real_scores["accuracy"] == 1.0 and real_scores["direction_accuracy"] == 1.0
    assert real_scores["fd"] < scores["fd"] and real_scores["fd_ratio"] < scores["fd_ratio"]
    report = json.loads((toy / "eval" / "report.json").read_text())
    assert report["kind"] == "moving-digits" and report["transformer"]["steps"] == 3 and report["images"] == 12
    settings = json.loads((toy / "eval" / "prompts.json").read_text())
    assert settings["call"] == {"height": 32, "width": 32, "num_frames": 9}


def test_resume_replays_a_straight_run(tmp_path):
    kwargs = dict(vae_steps=2, steps=4, threads=1, progress=False, images=8)
    straight = build_moving_digits(tmp_path / "straight", **kwargs)
    assert build_moving_digits(tmp_path / "split", stop_after=2, **kwargs) is None
    resumed = build_moving_digits(tmp_path / "split", resume=True, **kwargs)
    for name in (
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
    ):
        a, b = load_file(straight / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_registered_in_the_zoo_and_bad_steps_refused(tmp_path):
    assert "moving-digits" in available() and ZOO["moving-digits"][1] == ("test", "bench")
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        build_moving_digits(tmp_path, steps=0)


@pytest.mark.skipif(not SHIPPED_VIDEO, reason="no moving-digits shipped in this checkout")
def test_shipped_moving_digits_installs_checked_draws_what_is_asked_and_refuses_damage(tmp_path):
    from fastdiff.zoo.shipped import DATA_DIR_VIDEO

    assert shipped_table(DATA_DIR_VIDEO, "moving-digits") == SHIPPED_VIDEO
    out = build("moving-digits", tmp_path / "ok", size="bench")
    assert is_installed(out, "moving-digits") and (out / "eval" / "classifier.pt").is_file()
    pipe = load_flow_pipeline(out)
    pipe.set_progress_bar_config(disable=True)
    prompts = md.bench_prompts()[::4]  # 20: every digit, every direction
    frames = pipe(
        prompt=prompts,
        num_inference_steps=20,
        height=md.CANVAS,
        width=md.CANVAS,
        num_frames=md.FRAMES,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    scores = quality_for(pipe)(pipe, {"prompt": prompts}, frames)
    assert scores["accuracy"] >= 0.7 and scores["direction_accuracy"] >= 0.7, scores
    weights = out / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert not is_installed(out, "moving-digits")
    with pytest.raises(ShippedModelError, match="truncated or corrupt"):
        install(tmp_path / "copy", "moving-digits", source=out)
