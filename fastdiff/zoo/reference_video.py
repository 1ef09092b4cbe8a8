"""``moving-digits``: a text-conditional Wan-shaped video reference trained here with the rectified-flow loss.

A real ``WanPipeline`` (``AutoencoderKLWan``, ``WanTransformer3DModel``, ``UniPCMultistepScheduler`` with flow
sigmas, as Wan 2.1 ships) that draws 9-frame 32 px clips of a digit moving left, right, up or down, from
prompts such as "a handwritten seven moving left" (:mod:`fastdiff.zoo.moving_digits`: clips, captions and
metrics). Three parts, each built here, nothing from a hub:

- the VAE (Wan's causal 3D layout, 4x spatial and 2x temporal compression, 8 channels) trained to reconstruct
  the clips (MSE plus a small KL), its per-channel ``latents_mean`` / ``latents_std`` then set from the data;
- the text encoder: a frozen random-weight UMT5 over a local tokenizer (the transformer's text embedding and
  cross-attention learn to read it);
- the transformer (4 blocks, width 128, 3D RoPE) trained with the rectified-flow loss on the normalised
  latents: logit-normal sigmas, ``x_t = (1 - sigma) z + sigma noise``, velocity ``noise - z``; prompt dropout
  0.1 (the empty prompt: guidance's unconditional branch) and an EMA.

Wan's pipeline pads every prompt to 512 tokens with zeros; those zero tokens are identical after the text
embedding, so training keeps them as a few zero tokens whose attention logits carry ``log`` of how many they
stand for (``MultiplicityCrossAttnProcessor``): the same function as the pipeline's 512-token context. The
saved model uses the stock processors and is called with the pipeline's defaults.

Example::

    from fastdiff.zoo.reference_video import build_moving_digits
    build_moving_digits("/tmp/moving-digits", vae_steps=5, steps=5, threads=1)   # a toy build, for the flow
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

from fastdiff.train.loop import ema_updater, train
from fastdiff.zoo import moving_digits as md
from fastdiff.zoo.reference_video_parts import (
    CONTEXT,
    DEFAULT_GUIDANCE,
    DEFAULT_STEPS,
    FLOW_SHIFT,
    PROMPT_DROPOUT,
    SIZES,
    VAE_FRAMES,
    MultiplicityCrossAttnProcessor,
    make_scheduler,
    make_text_parts,
    make_transformer,
    make_vae,
)
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.shipped import BUILD_COMMAND_VIDEO


class VideoDenoiser(torch.nn.Module):
    """The transformer under training, seeing each prompt's real tokens and a few counted zero tokens."""

    def __init__(self, transformer: WanTransformer3DModel):
        super().__init__()
        self.transformer = transformer
        self.cross = MultiplicityCrossAttnProcessor()

    def use_compressed_context(self) -> None:
        for block in self.transformer.blocks:
            block.attn2.set_processor(self.cross)

    def forward(self, noisy, timestep, context, bias):
        self.cross.bias = bias
        return self.transformer(
            hidden_states=noisy, timestep=timestep, encoder_hidden_states=context, return_dict=False
        )[0]


def compressed_prompts(pipe: WanPipeline, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's encodings of ``prompts`` cut to the longest prompt + 1 tokens, and the logit bias that
    makes the kept zero tokens count as all of the pipeline's ``CONTEXT - length`` zero tokens."""
    lengths = [
        int(m.sum())
        for m in pipe.tokenizer(
            prompts, padding="max_length", max_length=CONTEXT, truncation=True, return_tensors="pt"
        ).attention_mask
    ]
    kept = max(lengths) + 1
    with torch.no_grad():
        embeds, _ = pipe.encode_prompt(
            prompts, do_classifier_free_guidance=False, max_sequence_length=kept, device=torch.device("cpu")
        )
    bias = torch.zeros(len(prompts), kept)
    for i, length in enumerate(lengths):
        bias[i, length:] = math.log((CONTEXT - length) / (kept - length))
    return embeds, bias.view(len(prompts), 1, 1, kept)


def train_vae(
    clips: np.ndarray,
    steps: int,
    out: Path,
    seed: int,
    progress: bool = True,
    batch_size: int = 8,
    lr: float = 1e-3,
    kl_weight: float = 1e-4,
    resume: bool = True,
) -> tuple[AutoencoderKLWan, dict]:
    """Reconstruction training on random 5-frame windows of ``clips`` (N, F, H, W); returns (vae, report)."""
    torch.manual_seed(seed)
    vae = make_vae()
    pixels = md.as_video_tensor(clips)

    def loss_fn(net, g, device):
        index = torch.randint(0, len(pixels), (batch_size,), generator=g)
        start = int(torch.randint(0, md.FRAMES - VAE_FRAMES + 1, (1,), generator=g))
        x = pixels[index, :, start : start + VAE_FRAMES].to(device)
        posterior = net.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=g).to(device)
        kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()
        return F.mse_loss(net.decode(z).sample, x) + kl_weight * kl

    report = train(
        vae,
        loss_fn,
        steps,
        lr=lr,
        out_dir=out,
        seed=seed,
        progress=progress,
        max_grad_norm=1.0,
        checkpoint="vae_checkpoint.pt",
        log_name="vae_loss.csv",
        desc="moving-digits VAE",
        save_every=100,
        resume=resume,
    )
    report.update(batch_size=batch_size, lr=lr, kl_weight=kl_weight)
    return vae.cpu().eval().requires_grad_(False), report


def encode_clips(vae: AutoencoderKLWan, clips: np.ndarray, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of whole clips, normalised per channel; sets the VAE's latents_mean/std."""
    means, stds = [], []
    with torch.no_grad():
        for i in range(0, len(clips), batch):
            posterior = vae.encode(md.as_video_tensor(clips[i : i + batch])).latent_dist
            means.append(posterior.mean)
            stds.append(posterior.std)
    mean, std = torch.cat(means), torch.cat(stds)
    mu, sd = mean.mean((0, 2, 3, 4)), mean.std((0, 2, 3, 4))
    vae.register_to_config(latents_mean=mu.tolist(), latents_std=sd.tolist())
    view = (1, -1, 1, 1, 1)
    return (mean - mu.view(view)) / sd.view(view), std / sd.view(view)


def train_transformer(
    latents,
    context,
    bias,
    allowed,
    steps: int,
    out: Path,
    seed: int,
    progress: bool = True,
    batch_size: int = 32,
    lr: float = 5e-4,
    ema_decay: float = 0.999,
    resume: bool = True,
    stop_after: int | None = None,
):
    """Rectified-flow training of a fresh transformer on normalised latents; returns (EMA transformer, report)."""
    torch.manual_seed(seed)
    model = VideoDenoiser(make_transformer(context.shape[-1]))
    ema = copy.deepcopy(model)  # stock processors: the EMA copy is what ships
    model.use_compressed_context()
    mean, std = latents
    allowed = torch.as_tensor(allowed)
    sigmas = torch.arange(1000, 0, -1) / 1000.0  # the training sigmas (no shift)

    def loss_fn(net, g, device):
        index = torch.randint(0, len(mean), (batch_size,), generator=g)
        z0 = mean[index] + std[index] * torch.randn(mean[index].shape, generator=g)
        choice = (torch.rand(batch_size, generator=g) * allowed.shape[1]).long()
        prompt = allowed[index, choice].where(torch.rand(batch_size, generator=g) >= PROMPT_DROPOUT, 0)
        noise = torch.randn(z0.shape, generator=g)
        u = torch.sigmoid(torch.randn(batch_size, generator=g))  # logit-normal (0, 1), as SD3 and digits-flow
        sigma = sigmas[(u * len(sigmas)).long().clamp(max=len(sigmas) - 1)]
        s = sigma.view(-1, 1, 1, 1, 1)
        noisy = (1.0 - s) * z0 + s * noise
        pred = net(noisy.to(device), (sigma * 1000).to(device), context[prompt].to(device), bias[prompt].to(device))
        return F.mse_loss(pred, (noise - z0).to(device))

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
        checkpoint="transformer_checkpoint.pt",
        log_name="transformer_loss.csv",
        desc="moving-digits transformer",
        save_every=100,
        resume=resume,
        stop_after=stop_after,
    )
    report.update(batch_size=batch_size, lr=lr, ema_decay=ema_decay, prompt_dropout=PROMPT_DROPOUT)
    ema.cpu().eval()
    return ema.transformer, report


def build_moving_digits(
    out_dir: str | Path,
    vae_steps: int = SIZES["bench"]["vae_steps"],
    steps: int = SIZES["bench"]["steps"],
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    images: int | None = None,
) -> Path | None:
    """Train moving-digits (VAE for ``vae_steps``, then the transformer for ``steps``) into ``out_dir``.

    The evaluation classifier and split are the digits reference's (shipped, hash-checked); the clips are made
    from that split's training images (the first ``images`` of them: a toy build; None: all). ``resume=True``
    continues from the checkpoints; ``stop_after`` ends this call after that many transformer steps
    (checkpointed; returns None) for a later ``resume=True`` call to finish.

    Example::

        build_moving_digits("/tmp/moving-digits", vae_steps=5, steps=5, threads=1)
    """
    from fastdiff.zoo.reference_sd import digits_build

    out = Path(out_dir)
    with digits_build(out, threads, resume, vae_steps=vae_steps, steps=steps) as (x_train, y_train):
        x_train, y_train = x_train[:images], y_train[:images]
        clips, directions = md.make_clips(x_train)
        print(f"moving-digits: training the VAE ({vae_steps} steps) on {len(clips)} clips")
        vae, vae_report = train_vae(clips, vae_steps, out, seed, progress, resume=resume)
        latents = encode_clips(vae, clips)
        tokenizer, text_encoder = make_text_parts(seed)
        pipe = WanPipeline(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=make_scheduler(),
            transformer=make_transformer(text_encoder.config.d_model),
        )
        prompts, allowed = md.training_prompts(np.repeat(y_train, len(md.DIRECTIONS)), directions)
        context, bias = compressed_prompts(pipe, prompts)
        print(f"moving-digits: training the transformer ({steps} steps) on {len(prompts) - 1} captions")
        transformer, report = train_transformer(
            latents, context, bias, allowed, steps, out, seed, progress, resume=resume, stop_after=stop_after
        )
    if report["steps"] < steps:
        print(f"moving-digits: stopped at step {report['steps']} of {steps}; continue with resume=True")
        return None
    pipe.register_modules(transformer=transformer)
    pipe.save_pretrained(out)
    settings = {
        "bench_prompts": md.bench_prompts(),
        "guidance": DEFAULT_GUIDANCE,
        "call": {"height": md.CANVAS, "width": md.CANVAS, "num_frames": md.FRAMES},
    }
    (out / "eval" / "prompts.json").write_text(json.dumps(settings, indent=1))
    report = {
        "kind": "moving-digits",
        "seed": seed,
        "images": len(x_train),
        "vae": vae_report,
        "transformer": report,
        "default_guidance": DEFAULT_GUIDANCE,
        "default_steps": DEFAULT_STEPS,
        "flow_shift": FLOW_SHIFT,
    }
    (out / "eval" / "report.json").write_text(json.dumps(report, indent=2))
    return out


def evaluate_video(
    model: str | Path,
    guidance: float = DEFAULT_GUIDANCE,
    n: int = 200,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    threads: int | None = None,
) -> dict:
    """The metrics of ``n`` clips (the bench prompts cycled) from one seeded call of the pipeline's own sampler.

    Example::

        evaluate_video("/tmp/moving-digits", n=40)
    """
    import time

    from fastdiff.zoo.evaluators import moving_digits_quality

    if threads:
        torch.set_num_threads(threads)
    pipe = WanPipeline.from_pretrained(str(model))
    pipe.set_progress_bar_config(disable=True)
    base = md.bench_prompts()
    call = {
        "prompt": [base[i % len(base)] for i in range(n)],
        "guidance_scale": guidance,
        "num_inference_steps": steps,
        "height": md.CANVAS,
        "width": md.CANVAS,
        "num_frames": md.FRAMES,
    }
    started = time.perf_counter()
    frames = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(seed)).frames
    seconds = time.perf_counter() - started
    row = {"guidance": guidance, "steps": steps, "clips": n, "seed": seed, "seconds": round(seconds, 1)}
    row.update({k: float(v) for k, v in moving_digits_quality(pipe, call, frames, seed).items()})
    print(json.dumps(row), flush=True)
    return row


def vae_reconstruction(vae: AutoencoderKLWan, reference, n: int = 50) -> dict[str, float]:
    """PSNR, per-frame digit accuracy and FD (against all real test clips, as the samples are scored) of the VAE's
    reconstructions of the real clips of ``n`` test images: what the autoencoder alone allows. ``fd_test_real``:
    the FD of those real clips themselves (few digits: FD has a floor of its own), the reconstructions' yardstick."""
    from fastdiff.eval.quality import accuracy, fd

    clips, directions = md.make_clips(reference.x_test[:n])
    with torch.no_grad():
        decoded = vae.decode(vae.encode(md.as_video_tensor(clips)).latent_dist.mean).sample
    frames = ((decoded.clamp(-1, 1) + 1) / 2).mean(1).numpy()
    digits = np.repeat(reference.y_test[:n], len(md.DIRECTIONS) * md.FRAMES)
    windows = md.digit_windows(frames)
    real = md.digit_windows(md.make_clips(reference.x_test)[0])
    return {
        "psnr_test": float(10 * np.log10(1.0 / np.mean((frames - clips) ** 2))),
        "clips_test": len(clips),
        "accuracy_test": accuracy(windows, digits, reference.classifier),
        "fd_test": fd(windows, real, reference.classifier),
        "fd_test_real": fd(md.digit_windows(clips), real, reference.classifier),
    }


TARGET = {"accuracy_min": 0.9, "direction_accuracy_min": 0.9, "fd_max_over_floor": 3.0}


def build_results(model: str | Path, rows: list[dict]) -> dict:
    """The build's results file: the eval rows, the training reports, the VAE's reconstructions, the metrics on
    real clips (their ceiling) and whether the target (>= 90% digit and direction accuracy, FD <= 3x the floor)
    is met at the default guidance."""
    from fastdiff.eval.quality import load_reference_eval

    model = Path(model)
    report = json.loads((model / "eval" / "report.json").read_text())
    reference = load_reference_eval(model)
    vae = AutoencoderKLWan.from_pretrained(model / "vae").eval()
    default = [r for r in rows if r["guidance"] == report["default_guidance"] and r["steps"] == DEFAULT_STEPS]
    met = bool(default) and all(
        r["accuracy"] >= 0.9 and r["direction_accuracy"] >= 0.9 and r["fd"] <= 3 * r["fd_floor"] for r in default
    )
    return {
        "model": "moving-digits",
        "pipeline": "WanPipeline",
        "build_command": BUILD_COMMAND_VIDEO,
        "eval_command": "python -m fastdiff.zoo.reference_video eval DIR --json OUT.json",
        "default_guidance": report["default_guidance"],
        "default_steps": DEFAULT_STEPS,
        "training": report["transformer"],
        "vae": {**report["vae"], **vae_reconstruction(vae, reference)},
        "real_clips": md.video_metrics_real(reference.x_test, reference.y_test, reference),
        "target": {**TARGET, "met": met},
        "rows": rows,
    }


@register_model("moving-digits", sizes=tuple(SIZES))
def build_moving_digits_zoo(out_dir: Path, size: str = "bench", seed: int = 0, retrain: bool = False) -> None:
    """Zoo builder: ``test`` trains a toy (seconds); ``bench`` copies the shipped, hash-checked model for seed 0,
    or with ``retrain`` (or another seed) trains it (the sizes' steps; about an hour on the 2 CPU cores)."""
    from fastdiff.zoo.shipped import install_or_train

    install_or_train("moving-digits", out_dir, size, seed, retrain, SIZES, build_moving_digits)


def main(argv: list[str] | None = None) -> None:
    """``python -m fastdiff.zoo.reference_video build DIR [--steps N] [--resume]``, ``... eval DIR`` or ``... select
    DIR --json OUT`` (the default guidance chosen on selection seeds and reported on report seeds)."""
    import argparse

    from fastdiff.eval.record import write_record
    from fastdiff.eval.select import add_selection_arguments, select_guidance

    parser = argparse.ArgumentParser(prog="python -m fastdiff.zoo.reference_video")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train moving-digits into DIR")
    b.add_argument("out")
    b.add_argument("--vae-steps", type=int, default=SIZES["bench"]["vae_steps"])
    b.add_argument("--steps", type=int, default=SIZES["bench"]["steps"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--resume", action="store_true")
    b.add_argument("--stop-after", type=int, default=None)
    e = sub.add_parser("eval", help="digit / direction accuracy, FD and temporal consistency of a build")
    e.add_argument("model")
    e.add_argument("--guidance", type=float, nargs="+", default=[DEFAULT_GUIDANCE])
    e.add_argument("--n", type=int, default=200)
    e.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=None)
    e.add_argument("--json", default=None, help="also write the rows here")
    c = sub.add_parser("select", help="choose the default guidance on selection seeds, report on report seeds")
    c.add_argument("model")
    c.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    c.add_argument("--threads", type=int, default=None)
    add_selection_arguments(c, candidates=[1.0, 1.5, 2.0, 3.0, 5.0], also=[5.0], n=200)  # WanPipeline's own: 5
    args = parser.parse_args(argv)
    if args.command == "select":
        header = {
            "model": "moving-digits",
            "pipeline": "WanPipeline",
            "steps": args.steps,
            "clips": args.n,
            "shipped_default_guidance": DEFAULT_GUIDANCE,
            "target": TARGET,
        }
        minimums = {
            "accuracy": TARGET["accuracy_min"],
            "direction_accuracy": TARGET["direction_accuracy_min"],
        }
        select_guidance(
            lambda g, seed: evaluate_video(args.model, g, args.n, args.steps, seed, args.threads),
            args,
            header,
            minimums,
            TARGET["fd_max_over_floor"],
        )
        return
    if args.command == "build":
        build_moving_digits(
            args.out, args.vae_steps, args.steps, args.seed, args.resume, args.threads, stop_after=args.stop_after
        )
        return
    rows = []
    for scale in args.guidance:
        rows.append(evaluate_video(args.model, scale, args.n, args.steps, args.seed, args.threads))
        if args.json:  # rewritten after each scale
            write_record(args.json, build_results(args.model, rows), benchmark="reference_video", indent=1)


if __name__ == "__main__":
    main()
