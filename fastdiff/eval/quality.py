"""Sample quality by a digit classifier: accuracy, and FD on the classifier's features (the references' metrics).

FD is torchmetrics' ``FrechetInceptionDistance`` with the digit classifier's penultimate layer as the
feature extractor (a custom ``nn.Module``: no torch-fidelity or Inception weights needed).

Example::

    from fastdiff.eval.quality import accuracy, fd, load_reference_eval

    ref = load_reference_eval(".fastdiff-cache/digits")
    print(accuracy(ref.x_test, ref.y_test, ref.classifier), fd(ref.x_train[:360], ref.x_test, ref.classifier))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from fastdiff.core.inputs import model_prompts, pipeline_directory
from fastdiff.eval.classifier import (
    DigitClassifier,
    PenultimateFeatures,
    classifier_accuracy,
    load_classifier,
    to_classifier_input,
)
from fastdiff.eval.fd_spread import classifier_features
from fastdiff.eval.floor import FLOOR_DRAWS, draw_rng, matched_draw, ratio_to_floor


def accuracy(images, labels, classifier: DigitClassifier) -> float:
    """Fraction of ``images`` (in [0, 1], NHWC or NCHW) that ``classifier`` assigns to ``labels``.

    Example::

        accuracy(ref.x_test, ref.y_test, ref.classifier)  # the classifier's test accuracy
    """
    return classifier_accuracy(classifier, images, labels)


def _new_fd_metric(classifier: DigitClassifier) -> FrechetInceptionDistance:
    # Inputs are float images in [0, 1] that go straight to the custom extractor (normalize only
    # rescales for the built-in Inception), so normalize=False is correct here.
    return FrechetInceptionDistance(feature=PenultimateFeatures(classifier), reset_real_features=False)


def _update(metric: FrechetInceptionDistance, images, real: bool, batch_size: int = 512) -> None:
    for chunk in to_classifier_input(images).split(batch_size):
        metric.update(chunk, real=real)


def fd(images, real_images, classifier: DigitClassifier) -> float:
    """Frechet distance between classifier features of ``images`` and ``real_images`` (each >= 2 images).

    Example::

        fd(generated, ref.x_test, ref.classifier)  # ~fd_floor for a good model, ~1000s for noise
    """
    if len(images) < 2 or len(real_images) < 2:
        raise ValueError(f"fd needs at least 2 images on each side, got {len(images)} and {len(real_images)}")
    metric = _new_fd_metric(classifier)
    _update(metric, real_images, real=True)
    _update(metric, images, real=False)
    return float(metric.compute())


def fd_floor(train_images, test_images, classifier: DigitClassifier, n: int = 500, seed: int = 0) -> float:
    """FD of ``n`` random real train images vs the test images: the best FD ``n`` samples can expect.

    Example::

        fd_floor(ref.x_train, ref.x_test, ref.classifier, n=500)
    """
    if not 2 <= n <= len(train_images):
        raise ValueError(f"n must be in 2..{len(train_images)} (the train images available), got {n}")
    pick = np.random.default_rng(seed).choice(len(train_images), size=n, replace=False)
    return fd(np.asarray(train_images)[pick], test_images, classifier)


@dataclass
class ReferenceEval:
    """Classifier and split of a built digits model, with the test-set FD statistics cached."""

    directory: Path
    classifier: DigitClassifier
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    _metric: FrechetInceptionDistance | None = None
    _floors: dict[tuple[int, int], float] = field(default_factory=dict)
    _matched: dict[tuple[bytes, int], tuple[list[torch.Tensor], bool]] = field(default_factory=dict)
    _test_features: torch.Tensor | None = None

    def fd_to_test(self, images) -> float:
        """FD of ``images`` vs the test split (test features are computed once and kept)."""
        if len(images) < 2:
            raise ValueError(f"fd needs at least 2 images, got {len(images)}")
        if self._metric is None:
            self._metric = _new_fd_metric(self.classifier)
            _update(self._metric, self.x_test, real=True)
        self._metric.reset()  # drops the fake features only (reset_real_features=False)
        _update(self._metric, images, real=False)
        return float(self._metric.compute())

    def fd_floor(self, n: int, seed: int = 0) -> float:
        """``fd_floor`` at ``n`` samples (capped at the train size), cached."""
        key = (min(n, len(self.x_train)), seed)
        if key not in self._floors:
            self._floors[key] = fd_floor(self.x_train, self.x_test, self.classifier, n=key[0], seed=seed)
        return self._floors[key]

    def test_features(self) -> torch.Tensor:
        """Classifier features of the test split (computed once)."""
        if self._test_features is None:
            self._test_features = classifier_features(self.x_test, self.classifier)
        return self._test_features

    def matched_floor_draws(self, labels, seed: int = 0, draws: int = FLOOR_DRAWS) -> tuple[list[torch.Tensor], bool]:
        """Features of ``draws`` like-for-like real samples for generated ``labels`` (one distinct train image of
        the same digit per generated image), cached; and whether every draw's images are distinct."""
        labels = np.asarray(labels).reshape(-1)
        key = (labels.tobytes(), seed)
        if key not in self._matched:
            picks = [matched_draw(labels, self.y_train, draw_rng(seed, d)) for d in range(draws)]
            features = [classifier_features(self.x_train[idx], self.classifier) for idx, _ in picks]
            self._matched[key] = features, all(distinct for _, distinct in picks)
        return self._matched[key]

    def floor_stats(self, images, labels, seed: int = 0) -> dict:
        """FD floor of a like-for-like real sample of ``labels`` and the ratio FD / floor with its interval."""
        draws, distinct = self.matched_floor_draws(labels, seed)
        stats = ratio_to_floor(classifier_features(images, self.classifier), draws, self.test_features(), seed=seed)
        stats.pop("fd_gen_features")
        return {**stats, "fd_floor_distinct": distinct}


_CACHE: dict[Path, ReferenceEval] = {}


def load_reference_eval(directory: str | Path) -> ReferenceEval:
    """Load (once per directory) the classifier and split saved beside a digits pipeline."""
    directory = Path(directory).resolve()
    if directory not in _CACHE:
        split_path = directory / "eval" / "split.npz"
        if not split_path.is_file():
            raise FileNotFoundError(f"no split at {split_path}; is {directory} a digits build (fastdiff.zoo)?")
        with np.load(split_path) as split:
            arrays = {k: split[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        _CACHE[directory] = ReferenceEval(directory, load_classifier(directory / "eval" / "classifier.pt"), **arrays)
    return _CACHE[directory]


def digits_quality(pipe, call_kwargs: dict, images: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Accuracy, FD vs the test split, the like-for-like FD floor (the median over draws of as many distinct real
    train images of the same digits) and FD / floor with its paired-bootstrap interval
    (:mod:`fastdiff.eval.floor`).

    ``images`` is the pipeline's ``output_type="np"`` output; labels are ``call_kwargs["class_labels"]``.

    Example::

        kwargs = {"class_labels": list(range(10)) * 50, "num_inference_steps": 50}
        digits_quality(pipe, kwargs, pipe(**kwargs, output_type="np").images, seed=0)
    """
    if "class_labels" not in call_kwargs:
        raise ValueError(f"call_kwargs has no 'class_labels'; got keys {sorted(call_kwargs)}")
    labels = torch.as_tensor(call_kwargs["class_labels"]).reshape(-1).numpy()
    if len(labels) != len(images):
        raise ValueError(f"got {len(images)} images for {len(labels)} class_labels")
    ref = load_reference_eval(pipeline_directory(pipe))
    floor = ref.floor_stats(images, labels, seed)  # its ratio uses the same FD in float64 (equal to 1e-4)
    return {"accuracy": accuracy(images, labels, ref.classifier), "fd": ref.fd_to_test(images), **floor}


__all__ = [
    "accuracy",
    "fd",
    "fd_floor",
    "ReferenceEval",
    "load_reference_eval",
    "pipeline_directory",
    "digits_quality",
    "model_prompts",
]
