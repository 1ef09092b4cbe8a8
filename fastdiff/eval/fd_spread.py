"""How much of an FD difference is sampling noise: a paired bootstrap over images made from the same prompts and seeds.

Accelerated and plain runs of one benchmark share prompts and seeds, so image ``i`` of every set comes from the
same draw. Resampling the image indices (the same indices for every set) and recomputing each set's FD against
the fixed test split gives each FD's spread and, for a pair of sets, an interval of their FD difference: a
difference whose interval contains 0 is not distinguishable from the draw of prompts and seeds.

Example::

    from fastdiff.eval.fd_spread import difference_interval, paired_fd_bootstrap
    from fastdiff.eval.quality import load_reference_eval

    ref = load_reference_eval("/tmp/digits-flow")
    spread = paired_fd_bootstrap({"plain": plain_images, "cached": cached_images}, ref, resamples=500)
    print(spread["std"], difference_interval(spread["samples"]["cached"], spread["samples"]["plain"]))
"""

from __future__ import annotations

import numpy as np
import torch

# torchmetrics' own Frechet formula (eigenvalues of the covariance product), so bootstrap FDs match `fd` exactly
from torchmetrics.image.fid import _compute_fid

from fastdiff.eval.classifier import DigitClassifier, to_classifier_input


@torch.no_grad()
def classifier_features(images, classifier: DigitClassifier, batch_size: int = 512) -> torch.Tensor:
    """Penultimate features (N, feature_dim) of ``images`` in [0, 1], in float64 (as torchmetrics accumulates)."""
    classifier.eval()
    chunks = to_classifier_input(images).split(batch_size)
    return torch.cat([classifier.features(c) for c in chunks]).double()


def _fd(features: torch.Tensor, mean_real: torch.Tensor, cov_real: torch.Tensor) -> float:
    return float(_compute_fid(mean_real, cov_real, features.mean(0), torch.cov(features.T)))


class FixedReference:
    """FD of many feature sets against one real set, for bootstraps: the same value as torchmetrics' formula.

    Own code because torchmetrics solves a general eigenproblem of the covariance product per call (~3 ms); with
    the real covariance fixed, tr sqrt(C_r C_g) is the nuclear norm of X C_r^(1/2) / sqrt(n - 1) (X: the centred
    generated features): one small symmetric eigenproblem or SVD.

    Example::

        ref = FixedReference(real.mean(0), torch.cov(real.T))
        fds = [ref.fd(gen[idx]) for idx in resamples]
    """

    def __init__(self, mean_real: torch.Tensor, cov_real: torch.Tensor):
        values, vectors = torch.linalg.eigh(cov_real)
        self.mean, self.trace = mean_real, float(cov_real.trace())
        self.root = (vectors * values.clamp(min=0).sqrt()) @ vectors.T

    def fd(self, features: torch.Tensor) -> float:
        n = len(features)
        if n < 2:
            raise ValueError(f"FD needs at least 2 feature rows, got {n}")
        mean = features.mean(0)
        centred = features - mean
        scaled = centred @ self.root
        if n > scaled.shape[1]:  # the (dim x dim) Gram matrix has the same non-zero eigenvalues, and is smaller
            singular = torch.linalg.eigvalsh(scaled.T @ scaled).clamp(min=0).sqrt()
        else:
            singular = torch.linalg.svdvals(scaled)
        cross = singular.sum() / (n - 1) ** 0.5
        spread = centred.square().sum() / (n - 1)
        return float((mean - self.mean).square().sum() + self.trace + spread - 2 * cross)


def paired_fd_bootstrap(image_sets: dict[str, np.ndarray], ref, resamples: int = 500, seed: int = 0) -> dict:
    """FD of every set against ``ref``'s test split, on the full sets and on ``resamples`` paired resamples.

    Returns ``{"fd": {name: FD}, "std": {name: bootstrap std}, "samples": {name: array of resampled FDs}}``.
    Every set must hold the same number of images (image ``i`` of each set from the same prompt and seed).
    """
    sizes = {name: len(images) for name, images in image_sets.items()}
    if not sizes or len(set(sizes.values())) != 1 or min(sizes.values()) < 2:
        raise ValueError(f"paired sets need the same number (>= 2) of images each, got {sizes}")
    if not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples must be an integer >= 2, got {resamples!r}")
    real = classifier_features(ref.x_test, ref.classifier)
    mean_real, cov_real = real.mean(0), torch.cov(real.T)
    features = {name: classifier_features(images, ref.classifier) for name, images in image_sets.items()}
    n = next(iter(sizes.values()))
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    fixed = FixedReference(mean_real, cov_real)
    samples = {name: np.array([fixed.fd(f[torch.as_tensor(pick)]) for pick in picks]) for name, f in features.items()}
    return {
        "fd": {name: _fd(f, mean_real, cov_real) for name, f in features.items()},
        "std": {name: float(s.std(ddof=1)) for name, s in samples.items()},
        "samples": samples,
    }


def difference_interval(samples_a: np.ndarray, samples_b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of FD(a) - FD(b) over paired bootstrap samples (same resamples for both)."""
    if len(samples_a) != len(samples_b):
        raise ValueError(f"paired samples differ in length: {len(samples_a)} vs {len(samples_b)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    diff = np.asarray(samples_a) - np.asarray(samples_b)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(diff, [tail, 100 - tail])
    return float(lo), float(hi)


__all__ = ["FixedReference", "classifier_features", "paired_fd_bootstrap", "difference_interval"]
