"""recover (distillation fine-tuning with checkpoints and resume) and compress_model / load_compressed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.recover import (
    CHECKPOINT,
    MANIFEST,
    capture_inputs,
    compress_model,
    load_compressed,
    noised_inputs,
    recover,
    training_data,
)
from fastdiff.zoo import build
from fastdiff.zoo.pipelines import ClassConditionalPipeline
from fastdiff.zoo.reference import digits_split, reference_unet
from fastdiff.zoo.tiny import make_pipeline


def pruned_pair():
    teacher = FastPipeline(make_pipeline("tiny-ddpm", "test"))
    student = FastPipeline(make_pipeline("tiny-ddpm", "test"))
    student.accelerate("prune(ratio=0.5)")
    return student, teacher


def state(fp):
    return {k: v.clone() for k, v in fp.denoiser.state_dict().items()}


def test_capture_and_noised_inputs_follow_the_pipeline():
    fp = FastPipeline(make_pipeline("tiny-sd", "test"))
    inputs = capture_inputs(fp, batch=3)
    assert inputs["sample"].shape == (6, 4, 16, 16)  # guidance batches [uncond, cond]
    assert inputs["encoder_hidden_states"].shape[0] == 6 and fp.context.nfe == 0
    g = torch.Generator().manual_seed(0)
    noisy, target = noised_inputs(fp.pipe.scheduler.config, inputs, generator=g)
    assert noisy["sample"].shape == target.shape == inputs["sample"].shape
    assert noisy["timestep"].shape == (6,) and 0 <= int(noisy["timestep"].min())
    v = dict(fp.pipe.scheduler.config, prediction_type="v_prediction")
    x0 = torch.zeros(6, 4, 16, 16)
    _, velocity = noised_inputs(v, inputs, x0=x0, generator=torch.Generator().manual_seed(1))
    _, noise = noised_inputs(fp.pipe.scheduler.config, inputs, x0=x0, generator=torch.Generator().manual_seed(1))
    t = noised_inputs(v, inputs, x0=x0, generator=torch.Generator().manual_seed(1))[0]["timestep"]
    torch.testing.assert_close(velocity, DDPMScheduler.from_config(v).get_velocity(x0, noise, t))


def test_recover_lowers_the_distillation_loss():
    student, teacher = pruned_pair()
    result = recover(student, teacher, steps=12, lr=2e-3, batch=4, progress=False)
    assert result["steps"] == 12 and result["loss_last"] < result["loss_first"]


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    student, teacher = pruned_pair()
    straight = recover(student, teacher, steps=4, batch=2, out_dir=tmp_path / "a", save_every=2, progress=False)
    assert (tmp_path / "a" / CHECKPOINT).is_file()
    want = state(student)
    resumed, teacher = pruned_pair()
    first = recover(resumed, teacher, steps=4, batch=2, out_dir=tmp_path / "b", stop_after=2, progress=False)
    assert first["steps"] == 2
    second = recover(resumed, teacher, steps=4, batch=2, out_dir=tmp_path / "b", progress=False)
    assert second["resumed_from"] == 2 and second["steps"] == 4
    got = state(resumed)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)
    assert straight["loss_last"] == pytest.approx(second["loss_last"], rel=1e-5)


def test_recover_on_labelled_training_data(tmp_path):
    split = digits_split(16)
    (tmp_path / "eval").mkdir()
    np.savez(tmp_path / "eval" / "split.npz", **split)
    images, labels = training_data(tmp_path)
    assert images.shape == (len(split["y_train"]), 1, 16, 16) and images.min() >= -1 and images.max() <= 1
    torch.manual_seed(0)
    teacher = ClassConditionalPipeline(unet=reference_unet().eval(), scheduler=DDPMScheduler())
    student = ClassConditionalPipeline(unet=reference_unet().eval(), scheduler=DDPMScheduler())
    student_fp = FastPipeline(student)
    student_fp.accelerate("prune(ratio=0.5)")
    result = recover(student_fp, teacher, data=tmp_path, steps=2, batch=4, progress=False)
    assert result["steps"] == 2 and np.isfinite(result["loss_last"])
    assert training_data(tmp_path / "nothing-here") is None


def test_compress_model_saves_loadable_models(tmp_path):
    model = build("tiny-sd", tmp_path / "tiny-sd", size="test")
    report = compress_model(model, tmp_path / "pruned", "prune(ratio=0.5)", recover_steps=2, batch=2, progress=False)
    manifest = json.loads((tmp_path / "pruned" / MANIFEST).read_text())
    assert manifest["specs"] == "prune(ratio=0.5)" and manifest["load_accelerators"] == ""
    assert not (tmp_path / "pruned" / CHECKPOINT).exists()
    pruned = FastPipeline.from_pretrained(tmp_path / "pruned")
    applied = report["applied"]["prune(ratio=0.5)"]
    assert sum(p.numel() for p in pruned.denoiser.parameters()) == applied["params_after"]

    compress_model(
        model, tmp_path / "lowrank", "lowrank(rank=4,targets=all)", recover_steps=2, batch=2, progress=False
    )
    dense = FastPipeline.from_pretrained(tmp_path / "lowrank")  # the factors' products: a standard model
    split = load_compressed(tmp_path / "lowrank")
    assert split.accelerators and split.accelerators[0].spec_name == "lowrank"
    assert sum(p.numel() for p in split.denoiser.parameters()) < sum(p.numel() for p in dense.denoiser.parameters())
    kwargs = {"prompt": ["a cat"], "num_inference_steps": 2, "output_type": "np"}
    for fp in (dense, split):
        fp.pipe.set_progress_bar_config(disable=True)
    np.testing.assert_allclose(
        split(**kwargs, generator=torch.Generator().manual_seed(0)).images,
        dense(**kwargs, generator=torch.Generator().manual_seed(0)).images,
        atol=1e-4,
    )
    with pytest.raises(AcceleratorError, match="compress.*accelerators"):
        compress_model(model, tmp_path / "bad", "scheduler(name=ddim)", recover_steps=1)


def test_recover_is_deterministic_on_a_dit():
    # DiT's LabelEmbedding drops labels with the global RNG in train mode; recovery must not depend on it.
    results = []
    for global_seed in range(2):
        teacher = FastPipeline(make_pipeline("tiny-dit", "test"))
        student = FastPipeline(make_pipeline("tiny-dit", "test"))
        student.accelerate("lowrank(rank=4)")
        torch.manual_seed(global_seed)  # whatever the caller's global RNG holds
        recover(student, teacher, steps=2, batch=32, progress=False)
        results.append(state(student))
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
