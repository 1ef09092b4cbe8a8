"""``digits-flow``: a text-conditional SD3-shaped digits reference trained with the rectified-flow loss.

The flow-matching counterpart of ``digits-sd``: a real ``StableDiffusion3Pipeline`` (``SD3Transformer2DModel``,
``FlowMatchEulerDiscreteScheduler``) that draws 16 px digits from prompts, scored like digits-sd (the digits
reference's classifier and FD, the label being the digit each prompt names). Only the transformer trains: the
VAE and the CLIP text encoder are digits-sd's (shipped, sha256-checked), frozen; the CLIP weights serve as both
``text_encoder`` and ``text_encoder_2`` (``CLIPTextModelWithProjection`` with an identity projection) and there
is no T5 (``text_encoder_3=None``).

With no T5, the pipeline appends ``max_sequence_length`` (default 256) all-zero "T5" tokens to the 16 CLIP
tokens. SD3 gives context tokens no position, so the 256 zero tokens stay identical through every block and
act as one token whose attention weight is 256 times larger. Training uses exactly that: one zero token with
``log(256)`` added to its attention logits (``MultiplicityJointAttnProcessor``), the same function as the
pipeline's 272-token context at a fraction of the cost; the saved model uses the stock processors and is
called with the pipeline's defaults.

Training (SD3's recipe, as in diffusers' ``examples/dreambooth/train_dreambooth_sd3.py``): latents
``(z - shift_factor) * scaling_factor``, logit-normal timesteps (mean 0, std 1) mapped through the
scheduler's sigmas, ``x_t = (1 - sigma) z + sigma noise``, velocity target ``noise - z``, unweighted MSE;
plus prompt dropout 0.1 (the empty prompt: the unconditional branch of classifier-free guidance) and an EMA,
a fixed number of optimizer steps through ``fastdiff.train.loop.train`` (seeded, resumable).

Example::

    from fastdiff.zoo.reference_flow import build_reference_flow
    path = build_reference_flow("/tmp/digits-flow", steps=40, threads=1)   # a toy build, for the flow
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import (
    AutoencoderKL,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

from fastdiff.train.loop import ema_updater, train
from fastdiff.zoo.digit_captions import bench_prompts, stroke_words, training_prompts
from fastdiff.zoo.reference_flow_parts import (
    DEFAULT_GUIDANCE,
    MAX_SEQUENCE_LENGTH,
    PROMPT_DROPOUT,
    SHIFT,
    SIZES,
    MultiplicityJointAttnProcessor,
    make_scheduler,
    make_transformer,
)
from fastdiff.zoo.registry import register_model


def load_text_encoder(directory: str | Path) -> CLIPTextModelWithProjection:
    """digits-sd's ``CLIPTextModel`` as a ``CLIPTextModelWithProjection`` whose projection is the identity (the
    pooled embedding SD3 feeds its time embedding is then CLIP's pooled output itself)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config = CLIPTextConfig.from_pretrained(directory)
    if config.projection_dim != config.hidden_size:
        raise ValueError(f"need projection_dim == hidden_size, got {config.projection_dim} and {config.hidden_size}")
    model = CLIPTextModelWithProjection(config)
    state = {k.removeprefix("text_model."): v for k, v in load_file(directory / "model.safetensors").items()}
    model.text_model.load_state_dict(state)  # strict: every CLIPTextModel weight, nothing else
    with torch.no_grad():
        model.text_projection.weight.copy_(torch.eye(config.hidden_size))
    return model.eval().requires_grad_(False)


def digits_sd_parts(source: str | Path | None = None):
    """(vae, tokenizer, text encoder) of a digits-sd build (default: the shipped one, sha256-checked)."""
    from fastdiff.zoo.shipped import DATA_DIR_SD, SHIPPED_SD, ShippedModelError, verify

    if source is None:
        if not SHIPPED_SD:
            raise ShippedModelError(
                "this fastdiff has no shipped digits-sd; build one (`fastdiff reference build DIR --kind sd`) "
                "and pass it as sd_source"
            )
        source = verify(DATA_DIR_SD, "digits-sd")
    source = Path(source)
    vae = AutoencoderKL.from_pretrained(source / "vae").eval().requires_grad_(False)
    tokenizer = CLIPTokenizer.from_pretrained(source / "tokenizer")
    return vae, tokenizer, load_text_encoder(source / "text_encoder")


def encode_latents(vae: AutoencoderKL, x_train: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of the training images; sets the VAE's ``shift_factor`` (the latents' mean) and
    ``scaling_factor`` (1 / their std), which SD3's pipeline undoes as ``z / scaling_factor + shift_factor``."""
    with torch.no_grad():
        posterior = vae.encode(torch.as_tensor(x_train) * 2.0 - 1.0).latent_dist
    mean, std = posterior.mean, posterior.std
    vae.register_to_config(shift_factor=float(mean.mean()), scaling_factor=float(1.0 / mean.std()))
    return mean, std


def make_pipeline(transformer, vae, tokenizer, text_encoder) -> StableDiffusion3Pipeline:
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=make_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=copy.deepcopy(text_encoder),
        tokenizer_2=tokenizer,
        text_encoder_3=None,
        tokenizer_3=None,
    )


class FlowDenoiser(torch.nn.Module):
    """The transformer under training, seeing the compressed context (CLIP tokens + one counted zero token)."""

    def __init__(self, transformer: SD3Transformer2DModel):
        super().__init__()
        self.transformer = transformer

    def forward(self, noisy, timestep, prompt_embeds, pooled):
        return self.transformer(
            hidden_states=noisy,
            timestep=timestep,
            encoder_hidden_states=prompt_embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]


def train_transformer(
    latents,
    prompt_embeds,
    pooled,
    allowed,
    steps: int,
    out: Path,
    seed: int,
    progress: bool = True,
    batch_size: int = 64,
    lr: float = 5e-4,
    ema_decay: float = 0.999,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    resume: bool = True,
    stop_after: int | None = None,
):
    """Rectified-flow training of a fresh transformer on the scaled latents; returns (EMA transformer, report).

    ``latents``: (posterior mean, std) already in the transformer's space; ``prompt_embeds`` / ``pooled``: the
    pipeline's encodings of every training prompt with one zero "T5" token; ``allowed``: each image's prompt ids.
    """
    torch.manual_seed(seed)
    model = FlowDenoiser(make_transformer(prompt_embeds.shape[-1], pooled.shape[-1]))
    ema = copy.deepcopy(model)  # stock processors: the EMA copy is what ships
    model.transformer.set_attn_processor(MultiplicityJointAttnProcessor(MAX_SEQUENCE_LENGTH))
    mean, std = latents
    allowed = torch.as_tensor(allowed)
    sigmas = make_scheduler().sigmas  # 1000 training sigmas, shifted like the inference ones

    def loss_fn(net, g, device):
        index = torch.randint(0, len(mean), (batch_size,), generator=g)
        z0 = mean[index] + std[index] * torch.randn(mean[index].shape, generator=g)
        choice = (torch.rand(batch_size, generator=g) * allowed.shape[1]).long()
        prompt = allowed[index, choice].where(torch.rand(batch_size, generator=g) >= PROMPT_DROPOUT, 0)
        noise = torch.randn(z0.shape, generator=g)
        # SD3's logit-normal timestep density (compute_density_for_timestep_sampling), seeded by the step
        u = torch.sigmoid(logit_mean + logit_std * torch.randn(batch_size, generator=g))
        sigma = sigmas[(u * len(sigmas)).long().clamp(max=len(sigmas) - 1)]
        s = sigma.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * z0 + s * noise
        pred = net(
            noisy.to(device), (sigma * 1000).to(device), prompt_embeds[prompt].to(device), pooled[prompt].to(device)
        )
        return F.mse_loss(pred, (noise - z0).to(device))  # compute_loss_weighting_for_sd3: 1 for logit-normal

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
        desc="digits-flow transformer",
        save_every=100,
        resume=resume,
        stop_after=stop_after,
    )
    report.update(
        batch_size=batch_size,
        lr=lr,
        ema_decay=ema_decay,
        logit_mean=logit_mean,
        logit_std=logit_std,
        prompt_dropout=PROMPT_DROPOUT,
        shift=SHIFT,
    )
    ema.cpu().eval()
    return ema.transformer, report


def build_reference_flow(
    out_dir: str | Path,
    steps: int = SIZES["bench"]["steps"],
    seed: int = 0,
    resume: bool = False,
    threads: int | None = None,
    progress: bool = True,
    sd_source: str | Path | None = None,
    stop_after: int | None = None,
    **train_kwargs,
) -> Path | None:
    """Train digits-flow's transformer for exactly ``steps`` optimizer steps into ``out_dir``.

    The VAE, tokenizer and text encoder are digits-sd's (``sd_source``, default the shipped copy), frozen; the
    evaluation classifier and split are the digits reference's (shipped, hash-checked). ``resume=True``
    continues from ``out_dir/transformer_checkpoint.pt``; ``stop_after`` ends this call after that many steps
    (checkpointed, nothing else written; returns None) for a later ``resume=True`` call to finish.

    Example::

        build_reference_flow("/tmp/digits-flow", steps=5, threads=1)
    """
    from fastdiff.zoo.reference_sd import digits_build

    out = Path(out_dir)
    with digits_build(out, threads, resume, steps=steps) as (x_train, y_train):
        vae, tokenizer, text_encoder = digits_sd_parts(sd_source)
        mean, std = encode_latents(vae, x_train)
        shift, scale = vae.config.shift_factor, vae.config.scaling_factor
        latents = ((mean - shift) * scale, std * scale)
        # the untrained transformer only tells encode_prompt the context width (joint_attention_dim)
        pipe = make_pipeline(make_transformer(), vae, tokenizer, text_encoder)
        prompts, allowed = training_prompts(y_train, stroke_words(x_train))
        with torch.no_grad():  # the pipeline's own encoding, with one zero "T5" token for the 256 it appends
            embeds, _, pooled, _ = pipe.encode_prompt(
                prompts,
                None,
                None,
                device=torch.device("cpu"),
                do_classifier_free_guidance=False,
                max_sequence_length=1,
            )
        print(f"digits-flow: training the transformer ({steps} steps) on digits-sd's frozen VAE and CLIP")
        transformer, report = train_transformer(
            latents,
            embeds,
            pooled,
            allowed,
            steps,
            out,
            seed,
            progress,
            resume=resume,
            stop_after=stop_after,
            **train_kwargs,
        )
    if report["steps"] < steps:
        print(f"digits-flow: stopped at step {report['steps']} of {steps}; continue with resume=True")
        return None
    pipe.register_modules(transformer=transformer)
    pipe.save_pretrained(out)
    # the bench prompts and the guidance `fastdiff bench` uses for this model (``core.inputs.make_inputs``)
    settings = {"bench_prompts": bench_prompts(), "guidance": DEFAULT_GUIDANCE}
    (out / "eval" / "prompts.json").write_text(json.dumps(settings, indent=1))
    report = {
        "kind": "digits-flow",
        "seed": seed,
        "transformer": report,
        "scaling_factor": scale,
        "shift_factor": shift,
        "max_sequence_length": MAX_SEQUENCE_LENGTH,
        "default_guidance": DEFAULT_GUIDANCE,
    }
    (out / "eval" / "report.json").write_text(json.dumps(report, indent=2))
    return out


def null_components(directory: str | Path) -> dict[str, None]:
    """The components a saved pipeline records as absent (``[null, null]`` in ``model_index.json``: here
    ``text_encoder_3`` and ``tokenizer_3``). diffusers loads them only when passed explicitly, the way its docs
    drop SD3's T5: ``DiffusionPipeline.from_pretrained(DIR, **null_components(DIR))``.

    Example::

        pipe = DiffusionPipeline.from_pretrained(path, **null_components(path))
    """
    index = json.loads((Path(directory) / "model_index.json").read_text())
    return {k: None for k, v in index.items() if not k.startswith("_") and v == [None, None]}


TARGET = {"accuracy_min": 0.95, "fd_max_over_floor": 3.0}  # FD within 3x a like-for-like floor


def load_flow_pipeline(directory: str | Path) -> StableDiffusion3Pipeline:
    """``DiffusionPipeline.from_pretrained`` of a digits-flow build (no T5)."""
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(str(directory), **null_components(directory))


def evaluate_flow(
    model: str | Path,
    guidance_scales=(DEFAULT_GUIDANCE,),
    n: int = 500,
    steps: int = 28,
    seed: int = 0,
    threads: int | None = None,
) -> list[dict]:
    """Accuracy, FD and FD floor of ``n`` images (the bench prompts cycled: n/10 per digit) per guidance scale,
    with the pipeline's own flow Euler sampler at ``steps`` steps; one seeded call per scale, as ``fastdiff
    bench --batch n`` makes it.

    Example::

        evaluate_flow("/tmp/digits-flow", guidance_scales=(4.0,), n=100)
    """
    import time

    from fastdiff.zoo.evaluators import digits_sd_quality

    if threads:
        torch.set_num_threads(threads)
    pipe = load_flow_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    base = bench_prompts()
    prompts = [base[i % len(base)] for i in range(n)]
    rows = []
    for scale in guidance_scales:
        started = time.perf_counter()
        images = pipe(
            prompt=prompts,
            guidance_scale=scale,
            num_inference_steps=steps,
            output_type="np",
            generator=torch.Generator().manual_seed(seed),
        ).images
        seconds = time.perf_counter() - started
        quality = digits_sd_quality(pipe, {"prompt": prompts}, images, seed)
        rows.append(
            {
                "guidance": scale,
                "steps": steps,
                "images": n,
                "seed": seed,
                "seconds": round(seconds, 1),
                **{k: float(v) for k, v in quality.items()},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


@register_model("digits-flow", sizes=tuple(SIZES))
def build_digits_flow(out_dir: Path, size: str = "bench", seed: int = 0, retrain: bool = False) -> None:
    """Zoo builder: ``test`` trains a toy (40 steps, seconds); ``bench`` copies the shipped, hash-checked model
    (``fastdiff.zoo.shipped``) for seed 0, or with ``retrain`` (or another seed) trains it (18000 steps, about
    2 hours on one CPU thread; the GPU when there is one).

    Example::

        build_digits_flow(Path("/tmp/digits-flow"), size="test")
    """
    from fastdiff.zoo.shipped import install_or_train

    install_or_train("digits-flow", out_dir, size, seed, retrain, SIZES, build_reference_flow)


def main(argv: list[str] | None = None) -> None:
    """``python -m fastdiff.zoo.reference_flow build DIR [--steps N] [--resume]`` or ``... eval DIR [--guidance G
    ...]``."""
    import argparse

    from fastdiff.eval.record import write_record
    from fastdiff.eval.select import add_selection_arguments, select_guidance

    parser = argparse.ArgumentParser(prog="python -m fastdiff.zoo.reference_flow")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train digits-flow into DIR")
    b.add_argument("out")
    b.add_argument("--steps", type=int, default=SIZES["bench"]["steps"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--resume", action="store_true")
    b.add_argument("--stop-after", type=int, default=None)
    b.add_argument("--lr", type=float, default=5e-4)
    e = sub.add_parser("eval", help="accuracy / FD / floor of a digits-flow build")
    e.add_argument("model")
    e.add_argument("--guidance", type=float, nargs="+", default=[DEFAULT_GUIDANCE])
    e.add_argument("--n", type=int, default=500)
    e.add_argument("--steps", type=int, default=28)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=None)
    e.add_argument("--json", default=None, help="also write the rows here")
    c = sub.add_parser("select", help="choose the default guidance on selection seeds, report on report seeds")
    c.add_argument("model")
    c.add_argument("--steps", type=int, default=28)
    c.add_argument("--threads", type=int, default=None)
    add_selection_arguments(c, candidates=[1.0, 1.5, 2.0, 4.0], also=[], n=500)
    args = parser.parse_args(argv)
    if args.command == "select":
        header = {
            "model": "digits-flow",
            "pipeline": "StableDiffusion3Pipeline",
            "steps": args.steps,
            "images": args.n,
            "shipped_default_guidance": DEFAULT_GUIDANCE,
            "target": TARGET,
        }
        select_guidance(
            lambda g, seed: evaluate_flow(args.model, (g,), args.n, args.steps, seed, args.threads)[0],
            args,
            header,
            {"accuracy": TARGET["accuracy_min"]},
            TARGET["fd_max_over_floor"],
        )
        return
    if args.command == "build":
        build_reference_flow(
            args.out,
            steps=args.steps,
            seed=args.seed,
            resume=args.resume,
            threads=args.threads,
            stop_after=args.stop_after,
            lr=args.lr,
        )
    else:
        rows = []
        for scale in args.guidance:  # one scale at a time, the JSON rewritten after each
            rows += evaluate_flow(args.model, (scale,), args.n, args.steps, args.seed, args.threads)
            if args.json:
                write_record(args.json, {"model": str(args.model), "rows": rows}, benchmark="reference_flow")


if __name__ == "__main__":
    main()
