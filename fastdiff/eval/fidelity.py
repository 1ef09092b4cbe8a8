"""Fidelity of accelerated outputs to reference outputs: PSNR and SSIM (torchmetrics, data_range=1).

Example::

    import numpy as np
    from fastdiff.eval.fidelity import psnr, ssim

    ref = np.random.rand(4, 16, 16, 1)
    print(psnr(ref, ref), ssim(ref, ref))  # inf 1.0
"""

from __future__ import annotations

import numpy as np
import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure


def _as_nchw(images, name: str) -> torch.Tensor:
    """(N,H,W,C) or (N,H,W) array in [0, 1], or clips (N,F,H,W,C) as N*F frames -> float64 (N,C,H,W) tensor."""
    x = torch.as_tensor(np.asarray(images, dtype=np.float64))
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim == 5:  # video pipelines' output.frames: every frame counts as an image
        x = x.flatten(0, 1)
    if x.ndim != 4:
        raise ValueError(f"{name} must be (N,H,W,C), (N,H,W) or clips (N,F,H,W,C), got shape {tuple(x.shape)}")
    return x.permute(0, 3, 1, 2)


def _pair(images, reference) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _as_nchw(images, "images"), _as_nchw(reference, "reference")
    if x.shape != y.shape:
        raise ValueError(f"images shape {tuple(x.shape)} differs from reference shape {tuple(y.shape)}")
    return x, y


def psnr(images: np.ndarray, reference: np.ndarray) -> float:
    """Mean per-image PSNR in dB (inf when every image equals its reference).

    Example::

        psnr(np.zeros((2, 8, 8, 3)), np.full((2, 8, 8, 3), 0.1))  # ~20.0 dB
    """
    x, y = _pair(images, reference)
    per_image = peak_signal_noise_ratio(x, y, data_range=1.0, reduction="none", dim=(1, 2, 3))
    return float(per_image.mean())


def ssim(images: np.ndarray, reference: np.ndarray) -> float:
    """Mean SSIM (1.0 for identical images); the Gaussian window shrinks to fit tiny images.

    Example::

        ssim(np.ones((2, 16, 16, 1)) * 0.5, np.ones((2, 16, 16, 1)) * 0.5)  # 1.0
    """
    x, y = _pair(images, reference)
    # torchmetrics' default 11x11 window; odd and no larger than the image so 8x8 inputs still work.
    kernel = min(11, min(x.shape[-2:]) - (1 - min(x.shape[-2:]) % 2))
    sigma = 1.5 * kernel / 11
    value = structural_similarity_index_measure(x, y, data_range=1.0, kernel_size=kernel, sigma=sigma)
    return float(value)


__all__ = ["psnr", "ssim"]
