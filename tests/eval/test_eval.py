"""Digits quality metrics (accuracy, FD, fd_floor, the registered evaluator) and PSNR/SSIM fidelity."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from diffusers import DDPMScheduler

from fastdiff import load_pipeline
from fastdiff.eval import QUALITY, quality_for
from fastdiff.eval.classifier import PenultimateFeatures, save_classifier, train_classifier
from fastdiff.eval.fd_spread import FixedReference, _fd, difference_interval, paired_fd_bootstrap
from fastdiff.eval.fidelity import psnr, ssim
from fastdiff.eval.floor import draw_rng, matched_draw
from fastdiff.eval.quality import (
    ReferenceEval,
    accuracy,
    digits_quality,
    fd,
    fd_floor,
    load_reference_eval,
    pipeline_directory,
)
from fastdiff.zoo.pipelines import ClassConditionalPipeline
from fastdiff.zoo.reference import digits_split, reference_unet


@pytest.fixture(scope="module")
def split():
    return digits_split(16, seed=0)


@pytest.fixture(scope="module")
def classifier(split):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny CNN: one thread is as fast, and far faster on an oversubscribed machine
    try:
        return train_classifier(split["x_train"], split["y_train"], epochs=6, seed=0)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory, split, classifier):
    """A digits-style directory: an (untrained) pipeline with the classifier and split beside it."""
    out = tmp_path_factory.mktemp("digits-eval")
    ClassConditionalPipeline(unet=reference_unet(16), scheduler=DDPMScheduler(clip_sample=False)).save_pretrained(out)
    save_classifier(classifier, out / "eval" / "classifier.pt")
    np.savez_compressed(out / "eval" / "split.npz", **split)
    return out


def nhwc(images: np.ndarray) -> np.ndarray:
    return images.transpose(0, 2, 3, 1)


def test_split_is_stratified_fixed_and_disjoint(split):
    assert split["x_train"].shape == (1437, 1, 16, 16) and split["x_test"].shape == (360, 1, 16, 16)
    assert not set(split["train_idx"]) & set(split["test_idx"])
    assert np.bincount(split["y_test"]).min() >= 35  # every digit ~36 times in the test split
    assert 0.0 <= split["x_train"].min() and split["x_train"].max() <= 1.0
    np.testing.assert_array_equal(digits_split(16, seed=0)["test_idx"], split["test_idx"])
    assert not np.array_equal(digits_split(16, seed=1)["test_idx"], split["test_idx"])


def test_classifier_accuracy_on_real_digits(split, classifier):
    test_acc = accuracy(split["x_test"], split["y_test"], classifier)
    assert test_acc >= 0.93
    # NHWC input (the pipeline's np output layout) gives the same answer
    assert accuracy(nhwc(split["x_test"]), split["y_test"], classifier) == test_acc
    # wrong labels are counted as wrong
    assert accuracy(split["x_test"], (split["y_test"] + 1) % 10, classifier) < 0.1


def test_fd_real_vs_noise(split, classifier):
    floor = fd_floor(split["x_train"], split["x_test"], classifier, n=360, seed=0)
    real = fd(split["x_train"][-360:], split["x_test"], classifier)
    noise = np.random.default_rng(0).random((360, 1, 16, 16)).astype(np.float32)
    noise_fd = fd(noise, split["x_test"], classifier)
    assert 0 < floor < noise_fd / 20
    assert real < 2 * floor
    assert accuracy(noise, np.arange(360) % 10, classifier) < 0.3
    # fd grows as real images are corrupted more
    rng = np.random.default_rng(1)
    corrupted = [
        fd(
            np.clip(split["x_train"][:360] + s * rng.standard_normal((360, 1, 16, 16)), 0, 1),
            split["x_test"],
            classifier,
        )
        for s in (0.1, 0.3, 0.6)
    ]
    assert real < corrupted[0] < corrupted[1] < corrupted[2]


def test_fd_matches_scipy_frechet_distance(split, classifier):
    # Independent check of the torchmetrics path: the textbook formula with scipy's sqrtm.
    features = PenultimateFeatures(classifier)
    a = features(torch.as_tensor(split["x_train"][:300])).double().numpy()
    b = features(torch.as_tensor(split["x_test"])).double().numpy()
    mu_a, mu_b, cov_a, cov_b = a.mean(0), b.mean(0), np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    with warnings.catch_warnings():  # dead ReLU features make the covariances singular; sqrtm warns but copes
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        root = scipy.linalg.sqrtm(cov_a @ cov_b).real
    expected = ((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root)
    assert fd(split["x_train"][:300], split["x_test"], classifier) == pytest.approx(expected, rel=1e-3, abs=1e-3)


def test_fd_floor_validates_n(split, classifier):
    with pytest.raises(ValueError, match="n must be in 2..1437"):
        fd_floor(split["x_train"], split["x_test"], classifier, n=5000)
    with pytest.raises(ValueError, match="at least 2"):
        fd(split["x_test"][:1], split["x_test"], classifier)


def test_registered_evaluator_reads_directory_beside_pipeline(build_dir, split, classifier):
    pipe = load_pipeline(build_dir)
    assert type(pipe) is ClassConditionalPipeline
    assert quality_for(pipe) is digits_quality  # from the fastdiff.quality entry points, loaded on first use
    assert QUALITY["ClassConditionalPipeline"] is digits_quality
    assert pipeline_directory(pipe) == build_dir
    kwargs = {"class_labels": split["y_test"].tolist(), "num_inference_steps": 50}
    result = digits_quality(pipe, kwargs, nhwc(split["x_test"]), seed=0)
    assert set(result) == {
        "accuracy",
        "fd",
        "fd_floor",
        "fd_floor_low",
        "fd_floor_high",
        "fd_floor_draws",
        "fd_ratio",
        "fd_ratio_low",
        "fd_ratio_high",
        "fd_floor_distinct",
    }
    assert result["accuracy"] == accuracy(split["x_test"], split["y_test"], classifier)
    assert abs(result["fd"]) < 1e-3  # the test images against themselves
    # the floor: 5 draws of distinct train images with the test set's digit mix, image for image
    picks = [matched_draw(split["y_test"], split["y_train"], draw_rng(0, d))[0] for d in range(5)]
    assert all(list(split["y_train"][p]) == list(split["y_test"]) and len(set(p)) == len(p) for p in picks)
    others = [matched_draw(split["y_test"], split["y_train"], draw_rng(1, d))[0] for d in range(5)]
    assert not any(np.array_equal(a, b) for a in picks for b in others)  # seeds 0 and 1 share no draw
    draws = [fd(split["x_train"][p], split["x_test"], classifier) for p in picks]
    assert result["fd_floor"] == pytest.approx(float(np.median(draws)), rel=1e-3)
    assert result["fd_floor_low"] == pytest.approx(min(draws), rel=1e-3) and result["fd_floor_distinct"] is True
    # cached per directory: the same loaded object, and repeated calls agree
    assert load_reference_eval(build_dir) is load_reference_eval(str(build_dir))
    noisy = np.random.default_rng(0).random((100, 16, 16, 1))
    noisy_result = digits_quality(pipe, {"class_labels": list(range(10)) * 10}, noisy, seed=0)
    assert noisy_result["fd"] > 20 * result["fd_floor"]
    assert digits_quality(pipe, kwargs, nhwc(split["x_test"]), seed=0) == result


def test_evaluator_rejects_bad_input(build_dir, split):
    pipe = load_pipeline(build_dir)
    with pytest.raises(ValueError, match="class_labels"):
        digits_quality(pipe, {}, nhwc(split["x_test"]), seed=0)
    with pytest.raises(ValueError, match="360 images for 10"):
        digits_quality(pipe, {"class_labels": list(range(10))}, nhwc(split["x_test"]), seed=0)
    in_memory = ClassConditionalPipeline(unet=reference_unet(16), scheduler=DDPMScheduler())
    with pytest.raises(ValueError, match="cannot find the directory"):
        pipeline_directory(in_memory)


def test_psnr_ssim_identical_and_decreasing_with_noise():
    rng = np.random.default_rng(0)
    reference = rng.random((4, 16, 16, 1))
    assert psnr(reference, reference) == float("inf")
    assert ssim(reference, reference) == pytest.approx(1.0)
    noisy = [np.clip(reference + s * rng.standard_normal(reference.shape), 0, 1) for s in (0.02, 0.1, 0.3)]
    psnrs, ssims = [psnr(x, reference) for x in noisy], [ssim(x, reference) for x in noisy]
    assert psnrs[0] > psnrs[1] > psnrs[2] > 0
    assert 1.0 > ssims[0] > ssims[1] > ssims[2]
    # PSNR is 10 log10(1 / mse) per image
    shifted = np.clip(reference + 0.1, 0, 1)
    mse = ((shifted - reference) ** 2).mean(axis=(1, 2, 3))
    assert psnr(shifted, reference) == pytest.approx(float(np.mean(10 * np.log10(1 / mse))), rel=1e-6)
    # RGB and 8x8 images work too (SSIM window shrinks to fit)
    small = rng.random((2, 8, 8, 3))
    assert ssim(small, small) == pytest.approx(1.0) and psnr(small, small) == float("inf")


def test_fidelity_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="differs from reference shape"):
        psnr(np.zeros((2, 16, 16, 1)), np.zeros((3, 16, 16, 1)))
    with pytest.raises(ValueError, match="must be"):
        ssim(np.zeros((16,)), np.zeros((16,)))


@pytest.mark.parametrize("items", [3, 40, 300])  # fewer, about as many and more rows than feature dimensions
def test_fixed_reference_fd_is_torchmetrics_formula(items):
    gen = torch.Generator().manual_seed(items)
    real = torch.randn(2000, 48, generator=gen, dtype=torch.float64) @ torch.randn(48, 48, generator=gen).double()
    fake = torch.randn(items, 48, generator=gen, dtype=torch.float64) @ torch.randn(48, 48, generator=gen).double()
    mean, cov = real.mean(0), torch.cov(real.T)
    assert FixedReference(mean, cov).fd(fake + 0.5) == pytest.approx(_fd(fake + 0.5, mean, cov), rel=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        FixedReference(mean, cov).fd(fake[:1])


def test_paired_fd_bootstrap_spread_and_difference_interval(split, classifier):
    ref = ReferenceEval(Path("."), classifier, split["x_train"], split["y_train"], split["x_test"], split["y_test"])
    real = split["x_train"][:300]
    noisy = np.clip(real + 0.3 * np.random.default_rng(0).standard_normal(real.shape), 0, 1)
    spread = paired_fd_bootstrap({"real": real, "same": real.copy(), "noisy": noisy}, ref, resamples=50)
    assert spread["fd"]["real"] == pytest.approx(fd(real, split["x_test"], classifier), rel=1e-4)
    assert spread["std"]["real"] > 0 and spread["samples"]["noisy"].shape == (50,)
    assert difference_interval(spread["samples"]["same"], spread["samples"]["real"]) == (0.0, 0.0)
    low, high = difference_interval(spread["samples"]["noisy"], spread["samples"]["real"])
    assert 0 < low < high  # corrupted images are worse on every resample's interval
    with pytest.raises(ValueError, match="same number"):
        paired_fd_bootstrap({"a": real, "b": real[:10]}, ref)
    with pytest.raises(ValueError, match="resamples"):
        paired_fd_bootstrap({"a": real}, ref, resamples=1)
    with pytest.raises(ValueError, match="level"):
        difference_interval(spread["samples"]["real"], spread["samples"]["noisy"], level=1.5)
