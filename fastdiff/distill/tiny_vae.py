"""``fastdiff distill tiny-vae MODEL OUT``: a tiny decoder (diffusers' ``AutoencoderTiny``) distilled from a
pipeline's ``AutoencoderKL`` decoder, for the ``tiny-vae(path=OUT)`` accelerator.

Training pairs are the VAE's own: a latent drawn from the VAE's posterior of a training image (the model's
training split, ``eval/split.npz`` of the digits references) and the full decoder's image of that latent. The
tiny decoder reads the latent in the denoiser's space (``(z - shift_factor) * scaling_factor``, as TAESD does)
and learns the full decoder's output by mean squared error; only the decoder is trained (encoding keeps using
the pipeline's VAE). ``OUT`` gets the ``AutoencoderTiny`` (``save_pretrained``) and a manifest with the run's
options, its training report and the decoder's PSNR against the full decoder on the held-out test images.
Resumable (``resume=True``) through ``fastdiff.train.loop``.

Example::

    from fastdiff.distill.tiny_vae import tiny_vae
    from fastdiff.zoo.shipped import install

    model = install("/tmp/digits-sd", "digits-sd")
    report = tiny_vae(model, "/tmp/digits-sd-taesd", steps=20, progress=False)
    # fp.accelerate("tiny-vae(path=/tmp/digits-sd-taesd)")
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fastdiff.distill.common import MANIFEST, DistillError, check_out, finish_run, start_run
from fastdiff.train.data import training_data


def load_vae(model_dir: Path):
    """The pipeline's ``AutoencoderKL``, frozen; refused (before training) when there is none."""
    from diffusers import AutoencoderKL

    index = model_dir / "model_index.json"
    if not index.is_file():
        raise DistillError(f"{str(model_dir)!r} is not a diffusers pipeline directory (no model_index.json)")
    entry = json.loads(index.read_text()).get("vae")
    if not entry or entry[1] != "AutoencoderKL":
        raise DistillError(
            f"{str(model_dir)!r} has no AutoencoderKL (vae: {entry[1] if entry else 'none'}); a tiny decoder is "
            "distilled from an image pipeline's AutoencoderKL"
        )
    return AutoencoderKL.from_pretrained(model_dir / "vae").eval().requires_grad_(False)


def tiny_config(vae, channels: int, blocks: int) -> dict:
    """An ``AutoencoderTiny`` config with the VAE's latent and image channels and upsampling."""
    levels = len(vae.config.block_out_channels)
    return {
        "in_channels": vae.config.in_channels,
        "out_channels": vae.config.out_channels,
        "latent_channels": vae.config.latent_channels,
        "encoder_block_out_channels": (8,) * levels,
        "num_encoder_blocks": (1,) * levels,
        "decoder_block_out_channels": (channels,) * levels,
        "num_decoder_blocks": (blocks,) * (levels - 1) + (1,),
    }


def _test_images(model_dir: Path) -> torch.Tensor:
    with np.load(model_dir / "eval" / "split.npz") as split:
        return torch.as_tensor(split["x_test"], dtype=torch.float32) * 2 - 1


def _posterior(vae, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        dist = vae.encode(images).latent_dist
    return dist.mean, dist.std


def decoder_psnr(vae, decoder: torch.nn.Module, images: torch.Tensor) -> float:
    """PSNR (dB, pixels in [0, 1]) of ``decoder`` against the VAE's decoder on the posterior means of ``images``."""
    mean, _ = _posterior(vae, images)
    scale, shift = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    with torch.no_grad():
        full = (vae.decode(mean).sample / 2 + 0.5).clamp(0, 1)
        tiny = (decoder((mean - shift) * scale) / 2 + 0.5).clamp(0, 1)
    mse = torch.mean((full - tiny) ** 2).item()
    return float("inf") if mse == 0 else 10 * float(np.log10(1.0 / mse))


def tiny_vae(
    model_dir,
    out,
    *,
    steps: int = 2000,
    batch: int = 64,
    channels: int = 32,
    blocks: int = 2,
    lr: float = 1e-3,
    seed: int = 0,
    resume: bool = False,
    save_every: int = 200,
    progress: bool = True,
) -> dict:
    """Distill a tiny decoder from ``model_dir``'s VAE into ``out``; returns the manifest (see module doc)."""
    from diffusers import AutoencoderTiny

    from fastdiff.train.loop import train

    model_dir, out = Path(model_dir), Path(out)
    if steps < 1 or batch < 1 or channels < 1 or blocks < 1:
        raise DistillError(
            f"tiny-vae: steps, batch, channels and blocks must be >= 1, got {steps}, {batch}, {channels}, {blocks}"
        )
    command = {
        "command": "tiny-vae",
        "model": str(model_dir.resolve()),
        "steps": steps,
        "batch": batch,
        "channels": channels,
        "blocks": blocks,
        "lr": lr,
        "seed": seed,
    }
    vae = load_vae(model_dir)
    data = training_data(model_dir)
    if data is None:
        raise DistillError(
            f"{str(model_dir)!r} ships no training split (eval/split.npz): the tiny decoder learns the VAE's "
            "decodes of the model's training images"
        )
    check_out(out, command, resume)
    start_run(out, command)
    mean, std = _posterior(vae, data[0])
    scale, shift = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    torch.manual_seed(seed)
    tiny = AutoencoderTiny(**tiny_config(vae, channels, blocks))
    tiny.encoder.requires_grad_(False)  # only decoding is replaced

    def loss_fn(model, g, device):
        i = torch.randint(len(mean), (batch,), generator=g)
        z = mean[i] + std[i] * torch.randn(mean[i].shape, generator=g)
        with torch.no_grad():
            target = vae.decode(z.to(device)).sample.clamp(-1, 1)
        return torch.nn.functional.mse_loss(model.decoder((z.to(device) - shift) * scale), target)

    report = train(
        tiny,
        loss_fn,
        steps,
        lr=lr,
        out_dir=out / "train",
        resume=resume,
        save_every=save_every,
        seed=seed,
        progress=progress,
        frozen=(vae,),
        desc="tiny-vae",
    )
    tiny = tiny.cpu().eval()
    tiny.save_pretrained(out)
    test = _test_images(model_dir)
    measured = {
        "psnr_db_vs_vae_decoder": round(decoder_psnr(vae.cpu(), tiny.decoder, test), 2),
        "test_images": len(test),
        "decoder_parameters": sum(p.numel() for p in tiny.decoder.parameters()),
        "vae_decoder_parameters": sum(p.numel() for p in vae.decoder.parameters()),
    }
    finish_run(out, {"train": report, "measured": measured})
    return json.loads((out / MANIFEST).read_text())
