"""experts: a denoiser per part of the trajectory, sharing the scheduler; exact when the experts are the model."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from diffusers import UNet2DModel
from helpers import call

from fastdiff import FastPipeline
from fastdiff.core.registry import AcceleratorError
from fastdiff.zoo import build

run = functools.partial(call, steps=4, batch_size=2)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    return {
        "ddpm": build("tiny-ddpm", root / "ddpm"),
        "ddpm-other": build("tiny-ddpm", root / "ddpm-other", seed=1),
        "sd": build("tiny-sd", root / "sd"),
    }


def test_same_model_twice_is_the_model_bit_for_bit(dirs):
    fp = FastPipeline.from_pretrained(dirs["ddpm"])
    fp.set_progress_bar_config(disable=True)
    plain = run(fp)
    for models in (f"{dirs['ddpm']}|{dirs['ddpm']}", "self|self", f"self|{dirs['ddpm']}|self"):
        bounds = "0.5" if models.count("|") == 1 else "0.25|0.75"
        handle = fp.accelerate(f"experts(models={models},boundaries={bounds})")
        np.testing.assert_array_equal(run(fp), plain)
        assert fp.context.nfe == 4
        handle.remove()


def test_other_model_on_high_noise_changes_output_and_remove_restores(dirs):
    fp = FastPipeline.from_pretrained(dirs["ddpm"])
    fp.set_progress_bar_config(disable=True)
    plain = run(fp)
    other = FastPipeline.from_pretrained(dirs["ddpm-other"])
    other.set_progress_bar_config(disable=True)
    handle = fp.accelerate(f"experts(models={dirs['ddpm-other']}|self,boundaries=0.5)")
    mixed = run(fp)
    assert not np.array_equal(mixed, plain) and not np.array_equal(mixed, run(other))
    assert fp.context.nfe == 4  # 2 steps on each model
    handle.remove()
    np.testing.assert_array_equal(run(fp), plain)
    handle = fp.accelerate(f"experts(models={dirs['ddpm-other']}|self,boundaries=0.75)")
    assert not np.array_equal(run(fp), mixed)  # the boundary moves the switch
    handle.remove()


def test_mismatched_models_and_bad_values_are_refused(dirs, tmp_path):
    fp = FastPipeline.from_pretrained(dirs["ddpm"])
    with pytest.raises(AcceleratorError, match="UNet2DConditionModel"):
        fp.accelerate(f"experts(models={dirs['sd']}|self,boundaries=0.5)")
    narrow = tmp_path / "narrow"
    UNet2DModel(
        in_channels=1,
        out_channels=1,
        block_out_channels=(32, 64),
        sample_size=32,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    ).save_pretrained(narrow)
    with pytest.raises(AcceleratorError, match="in_channels=1"):
        fp.accelerate(f"experts(models={narrow}|self,boundaries=0.5)")
    with pytest.raises(AcceleratorError, match="does not exist"):
        fp.accelerate(f"experts(models={tmp_path / 'missing'}|self,boundaries=0.5)")
    for bad in (
        "models=self,boundaries=0.5",
        "models=self|self,boundaries=",
        "models=self|self,boundaries=1.5",
        "models=self|self|self,boundaries=0.6|0.3",
        "models=self|self,boundaries=x",
    ):
        with pytest.raises(AcceleratorError, match="experts"):
            fp.accelerate(f"experts({bad})")
    assert fp.accelerators == ()


def test_conflicts_with_hooks_inside_one_model(dirs):
    fp = FastPipeline.from_pretrained(dirs["ddpm"])
    with pytest.raises(AcceleratorError, match="conflicts"):
        fp.accelerate("experts(models=self|self,boundaries=0.5);deepcache")


def test_pruned_compress_output_takes_the_high_noise_steps(dirs, tmp_path):
    from fastdiff.compress.recover import compress_model

    pruned = tmp_path / "pruned"
    compress_model(dirs["ddpm"], pruned, "prune(ratio=0.5)", recover_steps=0, progress=False)
    fp = FastPipeline.from_pretrained(dirs["ddpm"])
    fp.set_progress_bar_config(disable=True)
    expert_calls = []
    handle = fp.accelerate(f"experts(models={pruned}|self,boundaries=0.25)")
    expert = handle.handles[0].info["experts"][0]
    assert expert.config.block_out_channels != fp.denoiser.config.block_out_channels  # the pruned widths
    expert.register_forward_hook(lambda *_: expert_calls.append(fp.context.progress))
    run(fp)
    assert expert_calls == [0.0] and fp.context.nfe == 4  # 1 of 4 steps on the pruned model, the first
    handle.remove()
