"""``digits-sd``: a text-conditional digits reference in the real ``StableDiffusionPipeline`` class.

The class-conditional digits reference measures what an accelerator costs on a UNet2DModel; this one does it
for the Stable-Diffusion-shaped accelerators (tome on cross-attention, deepcache on UNet2DConditionModel,
promptcache, cfg-interval): a small AutoencoderKL trained on the digits (16 px gray, 4x8x8 latents), a small
CLIP text encoder trained with a UNet2DConditionModel on varied prompts ("a handwritten seven", "the digit 7",
"number seven, thick strokes", ...). It is scored by the digits reference's own classifier and FD, with the
digit named in each prompt as its label (``digit_of``).

Both trainings run a fixed number of optimizer steps (``fastdiff.train.loop.train``: the GPU when there is
one), so the weights depend only on the seed and the step counts.

Example::

    from fastdiff.zoo.reference_sd import build_reference_sd
    path = build_reference_sd("/tmp/digits-sd", vae_steps=20, unet_steps=20)   # a toy build, for the flow
"""

from __future__ import annotations

import copy
import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from diffusers.training_utils import compute_snr
from transformers import CLIPTextModel

from fastdiff.train.loop import ema_updater, train
from fastdiff.zoo.digit_captions import EXTRA_WORDS, bench_prompts, stroke_words, training_prompts
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.tiny_base import sd_scheduler, text_config
from fastdiff.zoo.tokenizer import COMMON_WORDS, make_clip_tokenizer

MAX_TOKENS = 16  # the longest prompt is 9 tokens; short sequences keep cross-attention cheap
LATENT_SIDE = 8
SIZES = {
    "test": dict(vae_steps=60, unet_steps=60),
    # the shipped build (3000 UNet steps gave FD 27.1 at guidance 5, 21000 give 10.5-12.7)
    "bench": dict(vae_steps=500, unet_steps=21000),
}
PROMPT_DROPOUT = 0.1  # the empty prompt is the unconditional branch of classifier-free guidance


def make_vae() -> AutoencoderKL:
    """1-channel 16 px images <-> 4x8x8 latents (32/64 channels)."""
    return AutoencoderKL(
        in_channels=1,
        out_channels=1,
        latent_channels=4,
        sample_size=16,
        layers_per_block=1,
        block_out_channels=(32, 64),
        norm_num_groups=8,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    )


def make_unet(cross_attention_dim: int) -> UNet2DConditionModel:
    """SD-shaped UNet on 8x8 latents: cross-attention in the two upper levels (32/64/64 channels)."""
    return UNet2DConditionModel(
        sample_size=LATENT_SIDE,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64, 64),
        norm_num_groups=8,
        attention_head_dim=8,
        cross_attention_dim=cross_attention_dim,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    )


def train_vae(x_train: np.ndarray, steps: int, out: Path, seed: int, progress: bool = True):
    """MSE reconstruction + a small KL term, batch 64; sets ``scaling_factor`` to 1 / std of the latents."""
    torch.manual_seed(seed)
    vae = make_vae()
    images = torch.as_tensor(x_train) * 2.0 - 1.0

    def loss_fn(model, g, device):
        x = images[torch.randint(0, len(images), (64,), generator=g)].to(device)
        posterior = model.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=g).to(device)
        return F.mse_loss(model.decode(z).sample, x) + 1e-6 * posterior.kl().mean()

    report = train(
        vae,
        loss_fn,
        steps,
        lr=1e-3,
        out_dir=out,
        seed=seed,
        progress=progress,
        max_grad_norm=1.0,
        checkpoint="vae_checkpoint.pt",
        log_name="vae_loss.csv",
        desc="digits-sd vae",
    )
    vae.cpu().eval()
    with torch.no_grad():
        posterior = vae.encode(images).latent_dist
        recon = vae.decode(posterior.mean).sample
    vae.register_to_config(scaling_factor=float(1.0 / posterior.mean.std()))
    report["reconstruction_mse_01"] = float(F.mse_loss((recon + 1) / 2, (images + 1) / 2))
    return vae, report, (posterior.mean, posterior.std)


class TextToLatent(torch.nn.Module):
    """The text encoder and UNet trained together (one module for the shared training loop)."""

    def __init__(self, text_encoder: CLIPTextModel, unet: UNet2DConditionModel):
        super().__init__()
        self.text_encoder, self.unet = text_encoder, unet

    def forward(self, noisy: torch.Tensor, t: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.unet(noisy, t, encoder_hidden_states=self.text_encoder(input_ids)[0]).sample


def train_text_unet(
    latents,
    labels,
    strokes,
    tokenizer,
    steps: int,
    out: Path,
    seed: int,
    progress: bool = True,
    batch_size: int = 64,
    lr: float = 1e-3,
    snr_gamma: float = 5.0,
    ema_decay: float = 0.999,
):
    """Epsilon-prediction training on the VAE's latents (SD's noise schedule, Min-SNR weights, EMA, prompt
    dropout); returns the EMA text encoder and UNet and the training report."""
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(text_config(tokenizer, hidden=64, layers=2, heads=4))
    model = TextToLatent(text_encoder, make_unet(cross_attention_dim=64))
    # a module, not diffusers' EMAModel: the shared training loop checkpoints `extra` modules
    ema = copy.deepcopy(model)
    prompts, allowed = training_prompts(labels, strokes)
    ids = tokenizer(prompts, padding="max_length", max_length=MAX_TOKENS, truncation=True, return_tensors="pt")
    ids, allowed = ids.input_ids, torch.as_tensor(allowed)
    mean, std = latents
    noise_scheduler = DDPMScheduler.from_config(sd_scheduler().config)

    def loss_fn(net, g, device):
        index = torch.randint(0, len(mean), (batch_size,), generator=g)
        z0 = mean[index] + std[index] * torch.randn(mean[index].shape, generator=g)
        choice = (torch.rand(batch_size, generator=g) * allowed.shape[1]).long()
        prompt = allowed[index, choice].where(torch.rand(batch_size, generator=g) >= PROMPT_DROPOUT, 0)
        noise = torch.randn(z0.shape, generator=g)
        t = torch.randint(0, noise_scheduler.config.num_train_timesteps, (batch_size,), generator=g)
        noisy = noise_scheduler.add_noise(z0, noise, t)
        pred = net(noisy.to(device), t.to(device), ids[prompt].to(device))
        per_sample = F.mse_loss(pred, noise.to(device), reduction="none").mean(dim=(1, 2, 3))
        snr = compute_snr(noise_scheduler, t).to(device)  # Min-SNR weighting (Hang et al. 2023)
        return (per_sample * snr.clamp(max=snr_gamma) / snr).mean()

    report = train(
        model,
        loss_fn,
        steps,
        lr=lr,
        out_dir=out,
        seed=seed,
        progress=progress,
        max_grad_norm=1.0,
        extra={"ema": ema},
        after_step=ema_updater(ema, model, ema_decay),
        checkpoint="unet_checkpoint.pt",
        log_name="unet_loss.csv",
        desc="digits-sd unet",
    )
    ema.cpu().eval()
    return ema.text_encoder, ema.unet, report


def install_digits_eval(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """Copy the shipped digits reference's classifier and split (hash-checked) into ``out/eval``; the train split."""
    from fastdiff.zoo.shipped import DATA_DIR, verify_digits

    (out / "eval").mkdir(parents=True, exist_ok=True)
    verify_digits(DATA_DIR)
    for name in ("classifier.pt", "split.npz"):  # the digits reference's evaluation, shared
        shutil.copyfile(DATA_DIR / "eval" / name, out / "eval" / name)
    with np.load(out / "eval" / "split.npz") as split:
        return split["x_train"], split["y_train"]


@contextmanager
def digits_build(out: Path, threads: int | None, resume: bool, **steps: int):
    """Around a text-conditional digits build into ``out``: checks each of ``steps`` is a positive integer, sets
    torch's threads (restored after), installs the digits evaluation files, removes stale checkpoints unless
    ``resume``; yields the train split ``(x_train, y_train)``."""
    for name, value in steps.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        x_train, y_train = install_digits_eval(out)
        if not resume:
            for stale in out.glob("*_checkpoint.pt"):
                stale.unlink()
        yield x_train, y_train
    finally:
        torch.set_num_threads(previous)


def build_reference_sd(
    out_dir: str | Path,
    vae_steps: int = SIZES["bench"]["vae_steps"],
    unet_steps: int = SIZES["bench"]["unet_steps"],
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    progress: bool = True,
) -> Path:
    """Train digits-sd (VAE, then text encoder + UNet) for exactly the given steps into ``out_dir``.

    The evaluation classifier and the train/test split are the digits reference's own (shipped, hash-checked),
    so both references are scored alike. ``resume=True`` continues both trainings from their checkpoints.

    Example::

        build_reference_sd("/tmp/digits-sd", vae_steps=5, unet_steps=5, threads=1)
    """
    out = Path(out_dir)
    with digits_build(out, threads, resume, vae_steps=vae_steps, unet_steps=unet_steps) as (x_train, y_train):
        print(f"digits-sd: training the VAE ({vae_steps} steps), then text encoder + UNet ({unet_steps} steps)")
        vae, vae_report, latents = train_vae(x_train, vae_steps, out, seed, progress)
        tokenizer = make_clip_tokenizer(COMMON_WORDS + EXTRA_WORDS, model_max_length=MAX_TOKENS)
        text_encoder, unet, unet_report = train_text_unet(
            latents, y_train, stroke_words(x_train), tokenizer, unet_steps, out, seed, progress
        )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=sd_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out)
    (out / "eval" / "prompts.json").write_text(json.dumps({"bench_prompts": bench_prompts()}, indent=1))
    report = {
        "kind": "digits-sd",
        "seed": seed,
        "vae": vae_report,
        "text_unet": unet_report,
        "scaling_factor": vae.config.scaling_factor,
    }
    (out / "eval" / "report.json").write_text(json.dumps(report, indent=2))
    return out


@register_model("digits-sd", sizes=tuple(SIZES))
def build_digits_sd(out_dir: Path, size: str = "bench", seed: int = 0, retrain: bool = False) -> None:
    """Zoo builder: ``bench`` (seed 0) copies the shipped, hash-checked model instantly; ``test`` trains a toy
    (60 + 60 steps, about a minute); ``retrain=True`` or another seed trains the bench size (21000 steps, about
    100 min on 2 cores).

    Example::

        build_digits_sd(Path("/tmp/digits-sd"), size="bench")
    """
    from fastdiff.zoo.shipped import SHIPPED_SD, install

    if size not in SIZES:
        raise ValueError(f"digits-sd has no size {size!r}; allowed: {', '.join(SIZES)}")
    if size == "bench" and seed == 0 and not retrain and SHIPPED_SD:
        install(out_dir, "digits-sd")
        return
    build_reference_sd(out_dir, seed=seed, **SIZES[size])
