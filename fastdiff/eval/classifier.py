"""Small CNN digit classifier: the feature extractor behind the digits accuracy and FD metrics.

It is trained on the reference model's train split only, so its test accuracy is an honest ceiling
for the accuracy of generated digits, and its penultimate layer is the feature space for FD.

Example::

    import numpy as np
    from fastdiff.eval.classifier import train_classifier, classifier_accuracy

    x = np.random.rand(64, 1, 16, 16).astype("float32"); y = np.arange(64) % 10
    model = train_classifier(x, y, epochs=1)
    print(classifier_accuracy(model, x, y))
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm


class DigitClassifier(nn.Module):
    """Conv(32)x2 -> pool -> Conv(64)x2 -> pool -> 4x4 -> Linear(feature_dim) -> Linear(num_classes).

    Inputs are (N, 1, H, W) images in [0, 1] at any H, W >= 8 (adaptive pooling to 4x4).
    """

    def __init__(self, num_classes: int = 10, width: int = 32, feature_dim: int = 128, dropout: float = 0.3):
        super().__init__()
        self.config = {
            "num_classes": num_classes,
            "width": width,
            "feature_dim": feature_dim,
            "dropout": dropout,
        }
        w = width
        self.body = nn.Sequential(
            nn.Conv2d(1, w, 3, padding=1),
            nn.BatchNorm2d(w),
            nn.ReLU(),
            nn.Conv2d(w, w, 3, padding=1),
            nn.BatchNorm2d(w),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1),
            nn.BatchNorm2d(2 * w),
            nn.ReLU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1),
            nn.BatchNorm2d(2 * w),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(2 * w * 16, feature_dim),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(feature_dim, num_classes))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Penultimate features (N, feature_dim) of images in [0, 1]."""
        return self.body(images * 2.0 - 1.0)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


class PenultimateFeatures(nn.Module):
    """Wraps a classifier as a torchmetrics FID feature extractor (``num_features`` skips its dummy probe)."""

    def __init__(self, classifier: DigitClassifier):
        super().__init__()
        self.classifier = classifier.eval()
        self.num_features = classifier.config["feature_dim"]

    def train(self, mode: bool = True) -> PenultimateFeatures:
        return super().train(False)  # always in eval mode, like torchmetrics' own Inception wrapper

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier.features(images.float())


def to_classifier_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Convert images in [0, 1] as (N,H,W,C) / (N,C,H,W) / (N,H,W) numpy or torch to float (N,1,H,W).

    RGB inputs are averaged to gray.
    """
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images).float()
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ValueError(f"images must have 3 or 4 dims (N,H,W[,C]) or (N,C,H,W), got shape {tuple(x.shape)}")
    if x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):
        x = x.permute(0, 3, 1, 2)  # NHWC -> NCHW
    if x.shape[1] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got shape {tuple(x.shape)}")
    return x.mean(dim=1, keepdim=True) if x.shape[1] == 3 else x


def train_classifier(
    x_train: np.ndarray,
    y_train: np.ndarray,
    epochs: int = 30,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 2e-3,
    shift_pixels: int = 1,
) -> DigitClassifier:
    """Train a ``DigitClassifier`` on images in [0, 1] (N,1,H,W) with labels 0..9.

    ``shift_pixels`` random translations make it robust to small misalignment of generated digits.

    Example::

        model = train_classifier(split["x_train"], split["y_train"], epochs=30)
    """
    if epochs <= 0:
        raise ValueError(f"epochs must be positive, got {epochs}")
    torch.manual_seed(seed)
    x = to_classifier_input(x_train)
    y = torch.as_tensor(np.asarray(y_train)).long()
    model = DigitClassifier(num_classes=int(y.max()) + 1 if len(y) else 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(loader))
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    for _ in tqdm(range(epochs), desc="classifier", unit="epoch", leave=False):
        for images, labels in loader:
            if shift_pixels:
                dx, dy = torch.randint(-shift_pixels, shift_pixels + 1, (2,)).tolist()
                images = torch.roll(images, shifts=(dy, dx), dims=(2, 3))
            loss = F.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    model = accelerator.unwrap_model(model).cpu().eval()
    return model


@torch.no_grad()
def predict(model: DigitClassifier, images: np.ndarray | torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Predicted labels (N,) for images in [0, 1]."""
    x = to_classifier_input(images)
    model.eval()
    return torch.cat([model(chunk).argmax(dim=1) for chunk in x.split(batch_size)]).numpy()


def classifier_accuracy(model: DigitClassifier, images, labels) -> float:
    """Fraction of ``images`` the classifier labels as ``labels``."""
    labels = np.asarray(labels).reshape(-1)
    predicted = predict(model, images)
    if len(predicted) != len(labels):
        raise ValueError(f"got {len(predicted)} images but {len(labels)} labels")
    return float((predicted == labels).mean())


def save_classifier(model: DigitClassifier, path: str | Path) -> Path:
    """Save config + weights atomically (temp file then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"config": model.config, "state_dict": model.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


def load_classifier(path: str | Path) -> DigitClassifier:
    """Load a classifier saved by ``save_classifier`` (in eval mode)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no classifier at {path}; build the digits model first (fastdiff.zoo.build)")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = DigitClassifier(**saved["config"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()


__all__ = [
    "DigitClassifier",
    "PenultimateFeatures",
    "to_classifier_input",
    "train_classifier",
    "predict",
    "classifier_accuracy",
    "save_classifier",
    "load_classifier",
]
