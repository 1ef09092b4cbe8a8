"""Save image batches as PNG files and grids.

Example::

    import numpy as np
    from fastdiff.eval.grid import save_grid
    save_grid(np.random.rand(8, 16, 16, 3), "/tmp/grid.png", columns=4)
    save_clips(np.random.rand(2, 9, 16, 16, 3), "/tmp/clips")   # clip_000.gif, clip_001.gif, grid.png
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def to_uint8(images: np.ndarray) -> np.ndarray:
    """(N,H,W,C) floats in [0,1] -> uint8, grayscale expanded to RGB."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    return (np.clip(images, 0, 1) * 255).round().astype(np.uint8)


def make_grid(images: np.ndarray, columns: int = 10, pad: int = 1, scale: int = 1) -> Image.Image:
    pixels = to_uint8(images)
    n, h, w, _ = pixels.shape
    rows = -(-n // columns)
    canvas = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, 3), 255, np.uint8)
    for i, img in enumerate(pixels):
        r, c = divmod(i, columns)
        canvas[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    grid = Image.fromarray(canvas)
    return grid.resize((grid.width * scale, grid.height * scale), Image.NEAREST) if scale > 1 else grid


def save_grid(images: np.ndarray, path: str | Path, columns: int = 10, scale: int = 1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    make_grid(images, columns=min(columns, len(images)), scale=scale).save(path)
    return path


def save_images(images: np.ndarray, out_dir: str | Path, prefix: str = "image") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, img in enumerate(to_uint8(images)):
        paths.append(out / f"{prefix}_{i:03d}.png")
        Image.fromarray(img).save(paths[-1])
    return paths


def save_clips(clips: np.ndarray, out_dir: str | Path, fps: int = 8) -> list[Path]:
    """Video clips (N, frames, H, W, C) as one animated GIF each (``clip_000.gif``) and a grid with one row of
    frames per clip (``grid.png``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, frames in enumerate(clips):
        first, *rest = [Image.fromarray(f) for f in to_uint8(frames)]
        paths.append(out / f"clip_{i:03d}.gif")
        first.save(paths[-1], save_all=True, append_images=rest, duration=1000 // fps, loop=0)
    n, f, h = clips.shape[:3]
    save_grid(clips.reshape(n * f, *clips.shape[2:]), out / "grid.png", columns=f, scale=max(1, 128 // h))
    return paths
