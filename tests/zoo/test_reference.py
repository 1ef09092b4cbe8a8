"""The digits reference build (short run, resume) and ClassConditionalPipeline behaviour."""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DEISMultistepScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSDEScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    HeunDiscreteScheduler,
    LCMScheduler,
    PNDMScheduler,
    UniPCMultistepScheduler,
)

from fastdiff import load_pipeline
from fastdiff.eval.classifier import load_classifier
from fastdiff.zoo import ZOO
from fastdiff.zoo.pipelines import ClassConditionalPipeline
from fastdiff.zoo.reference import build_digits, build_reference, digits_split, train_unet

SCHEDULERS = [
    (DDIMScheduler, {}),
    (DDPMScheduler, {}),
    (PNDMScheduler, {}),
    (EulerDiscreteScheduler, {}),
    (EulerAncestralDiscreteScheduler, {}),
    (HeunDiscreteScheduler, {}),
    (DPMSolverMultistepScheduler, {}),
    (DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++"}),
    (
        DPMSolverSDEScheduler,
        {"noise_sampler_seed": 0},
    ),  # its Brownian noise is seeded by config, not generator
    (UniPCMultistepScheduler, {}),
    (DEISMultistepScheduler, {}),
    (LCMScheduler, {}),
]


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    build_reference(out, steps=3, classifier_epochs=1, seed=0, threads=1)
    return out


@pytest.fixture(scope="module")
def pipe(build_dir):
    pipe = load_pipeline(build_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sample(pipe, labels=(0, 1, 2), steps=4, seed=0, **kwargs) -> np.ndarray:
    generator = torch.Generator().manual_seed(seed)
    return pipe(list(labels), num_inference_steps=steps, generator=generator, output_type="np", **kwargs).images


def test_short_build_writes_pipeline_classifier_split_and_log(build_dir):
    model_index = json.loads((build_dir / "model_index.json").read_text())
    assert model_index["_class_name"] == "ClassConditionalPipeline"
    scheduler_config = json.loads((build_dir / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler_config["_class_name"] == "DDPMScheduler"
    assert scheduler_config["clip_sample"] is False and scheduler_config["prediction_type"] == "epsilon"
    unet_config = json.loads((build_dir / "unet" / "config.json").read_text())
    assert unet_config["num_class_embeds"] == 11 and "AttnDownBlock2D" in unet_config["down_block_types"]
    with np.load(build_dir / "eval" / "split.npz") as split:
        np.testing.assert_array_equal(split["test_idx"], digits_split(16, seed=0)["test_idx"])
        assert split["x_test"].shape == (360, 1, 16, 16)
    assert load_classifier(build_dir / "eval" / "classifier.pt").config["num_classes"] == 10
    report = json.loads((build_dir / "eval" / "report.json").read_text())
    assert report["train"]["steps"] == 3
    assert 0.0 <= report["classifier_test_accuracy"] <= 1.0 and report["fd_floor_500"] > 0
    rows = read_log(build_dir / "train_log.jsonl")
    assert rows[-1]["step"] == 3 and rows[-1]["loss"] > 0 and rows[-1]["steps_per_s"] > 0
    assert torch.load(build_dir / "checkpoint.pt", weights_only=False)["step"] == 3


def test_resume_continues_from_checkpoint(build_dir, tmp_path):
    classifier_bytes = (build_dir / "eval" / "classifier.pt").read_bytes()
    weights_before = (build_dir / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    build_reference(build_dir, steps=5, classifier_epochs=1, seed=0, resume=True, threads=1)
    assert torch.load(build_dir / "checkpoint.pt", weights_only=False)["step"] == 5
    assert [row["step"] for row in read_log(build_dir / "train_log.jsonl")] == [3, 5]  # appended
    assert (build_dir / "eval" / "classifier.pt").read_bytes() == classifier_bytes  # reused, not retrained
    assert (build_dir / "unet" / "diffusion_pytorch_model.safetensors").read_bytes() != weights_before
    assert not list(build_dir.rglob("*.tmp"))  # atomic writes left no temp files


def train(out_dir, steps=4, seed=0, resume=False, **options):
    out_dir.mkdir(exist_ok=True)
    split = digits_split(16)
    return train_unet(
        out_dir,
        split["x_train"],
        split["y_train"],
        steps=steps,
        resolution=16,
        seed=seed,
        resume=resume,
        **options,
    )


def test_training_runs_a_fixed_step_count_and_same_seed_gives_same_weights(tmp_path):
    unet_a, summary = train(tmp_path / "a")
    unet_b, _ = train(tmp_path / "b")
    assert summary["steps"] == 4 and summary["seed"] == 0 and not unet_a.training
    for key, value in unet_a.state_dict().items():
        assert torch.equal(value, unet_b.state_dict()[key]), key
    unet_c, _ = train(tmp_path / "c", seed=1)
    assert not torch.equal(unet_a.conv_in.weight, unet_c.conv_in.weight)


def test_interrupted_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    import fastdiff.zoo.reference_train as reference_train

    straight, _ = train(tmp_path / "straight")
    calls, compute_snr = [], reference_train.compute_snr

    def failing_snr(*args):  # the third step dies after two checkpointed steps
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return compute_snr(*args)

    monkeypatch.setattr(reference_train, "compute_snr", failing_snr)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", checkpoint_every_s=0.0)
    monkeypatch.setattr(reference_train, "compute_snr", compute_snr)
    assert torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)["step"] == 2
    resumed, summary = train(tmp_path / "resumed", resume=True)
    assert summary["steps"] == 4
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_time_budget_is_refused_with_a_clear_message(tmp_path, capsys):
    from fastdiff.cli.main import main

    with pytest.raises(ValueError, match="fixed number of optimizer steps"):
        build_reference(tmp_path, minutes=1.0)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        build_reference(tmp_path, steps=0)
    with pytest.raises(SystemExit, match="--minutes was removed.*--steps"):
        main(["reference", "build", str(tmp_path), "--minutes", "12"])
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_zoo_registration():
    fn, sizes = ZOO["digits"]
    assert fn is build_digits and sizes == ("test", "bench")
    with pytest.raises(ValueError, match="allowed: test, bench"):
        build_digits(None, size="huge")


def test_round_trip_is_bit_identical(pipe, tmp_path):
    assert type(pipe) is ClassConditionalPipeline
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False)
    pipe.save_pretrained(tmp_path)
    reloaded = load_pipeline(tmp_path)
    reloaded.set_progress_bar_config(disable=True)
    assert type(reloaded.scheduler) is DDIMScheduler and reloaded.scheduler.config.clip_sample is False
    for guidance in (1.0, 3.0):
        np.testing.assert_array_equal(sample(pipe, guidance_scale=guidance), sample(reloaded, guidance_scale=guidance))


def test_cfg_batches_uncond_then_cond_in_one_call(pipe):
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False)
    calls = []
    handle = pipe.unet.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((args[0].shape[0], kwargs["class_labels"].tolist())),
        with_kwargs=True,
    )
    try:
        guided = sample(pipe, labels=(3, 7), steps=3, guidance_scale=2.0)
        assert calls == [(4, [10, 10, 3, 7])] * 3
        calls.clear()
        plain = sample(pipe, labels=(3, 7), steps=3, guidance_scale=1.0)
        assert calls == [(2, [3, 7])] * 3
    finally:
        handle.remove()
    assert not np.array_equal(guided, plain)


def test_cfg_combines_branches_as_uncond_plus_scale_times_difference(pipe):
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False)
    latents = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    images = pipe([4, 9], num_inference_steps=1, guidance_scale=2.5, latents=latents, output_type="pt").images
    scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    scheduler.set_timesteps(1)
    t = scheduler.timesteps[0]
    with torch.no_grad():
        cond = pipe.unet(latents, t, class_labels=torch.tensor([4, 9])).sample
        uncond = pipe.unet(latents, t, class_labels=torch.tensor([10, 10])).sample
    expected = scheduler.step(uncond + 2.5 * (cond - uncond), t, latents).prev_sample
    torch.testing.assert_close(images, (expected / 2 + 0.5).clamp(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("scheduler_cls", "options"), SCHEDULERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_scheduler_runs_and_is_seeded(pipe, build_dir, scheduler_cls, options):
    saved_config = DDPMScheduler.from_pretrained(build_dir, subfolder="scheduler").config
    pipe.scheduler = scheduler_cls.from_config(saved_config, **options)
    first = sample(pipe, steps=4, seed=1, guidance_scale=2.0)  # PNDM needs >= 4 steps
    assert first.shape == (3, 16, 16, 1) and np.isfinite(first).all()
    assert first.min() >= 0.0 and first.max() <= 1.0
    # stochastic schedulers get the generator too, so the same seed gives the same images
    np.testing.assert_array_equal(first, sample(pipe, steps=4, seed=1, guidance_scale=2.0))


def test_output_types(pipe):
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False)
    pil = pipe([1, 2], num_inference_steps=2).images
    assert all(isinstance(im, PIL.Image.Image) and im.size == (16, 16) and im.mode == "L" for im in pil)
    pt = pipe(torch.tensor([1, 2]), num_inference_steps=2, output_type="pt").images
    assert pt.shape == (2, 1, 16, 16) and 0.0 <= pt.min() and pt.max() <= 1.0
    (arrays,) = pipe([5], num_inference_steps=2, output_type="np", return_dict=False)
    assert arrays.shape == (1, 16, 16, 1)


def test_invalid_inputs_raise(pipe):
    with pytest.raises(ValueError, match=r"\[10\] out of range; allowed: 0..9"):
        pipe([1, 10], num_inference_steps=2)
    with pytest.raises(ValueError, match="out of range"):
        pipe([-1], num_inference_steps=2)
    with pytest.raises(ValueError, match="must be integers"):
        pipe(torch.tensor([1.5]), num_inference_steps=2)
    for steps in (0, -3):
        with pytest.raises(ValueError, match="num_inference_steps must be a positive int"):
            pipe([1], num_inference_steps=steps)
    with pytest.raises(ValueError, match="allowed: pil, np, pt"):
        pipe([1], num_inference_steps=2, output_type="jpg")
    with pytest.raises(ValueError, match="expected"):
        pipe([1, 2], num_inference_steps=2, latents=torch.zeros(1, 1, 16, 16))
