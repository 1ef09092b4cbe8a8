"""One-step students by distribution matching: DMD2 (Yin et al. 2024) and score identity distillation (SiD,
Zhou et al. 2024), for a diffusers pipeline whose UNet predicts epsilon, v or the sample.

The generator reads pure noise at the last training timestep and predicts v (x0 = sqrt(a) z - sqrt(1-a) v):
an epsilon readout there divides by sqrt(alpha-bar) (157x on the digits schedule) and does not train. It
starts from a teacher that predicts v, or (``init``) from a one-step progressive student of an epsilon
teacher. A "fake score" denoiser, initialised from the teacher, learns the generator's outputs with the
teacher's own loss, ``fake_updates`` times per generator step at its own learning rate (DMD2's two
time-scale rule). The generator then moves its samples along the difference of the two denoisers' x0
estimates at a random noise level in ``t_range`` (the distribution-matching gradient, normalised per sample
by the distance to the teacher's estimate); classifier-free guidance is applied to the teacher's estimate
only, so the student needs one call per image. ``method="sid"`` uses SiD's score-identity loss instead
(data-free; gradients flow through both denoisers' inputs, ``sid_alpha`` 1.2 as in the paper).
``regression`` > 0 adds the MSE to the teacher's own ODE samples of ``pairs`` fixed noises (DDIM or flow Euler,
``pair_steps`` steps, generated once into ``OUT/train/pairs.pt``).

The student is saved as ``OUT/steps-1``, a pipeline with a v-prediction DDIM ``trailing`` scheduler; its
``fastdiff_distill.json`` says ``scheduler(name=ddim,steps=1)`` and guidance 1 (the guidance is baked in).
Training checkpoints (generator, fake score, both optimizers, EMA) live in ``OUT/train``: a killed run
resumes exactly with ``resume=True``; a non-finite loss stops the run naming the step.

Example::

    from fastdiff.distill.dmd import dmd
    from fastdiff.distill.progressive import progressive
    from fastdiff.zoo import build

    teacher = build("tiny-ddpm", "/tmp/tiny-ddpm")
    progressive(teacher, "/tmp/prog", start=2, end=1, steps_per_round=5, progress=False)
    dmd(teacher, "/tmp/dmd", init="/tmp/prog/steps-1", train_steps=5, batch=4, progress=False)
    # fastdiff.distill.common.load_student("/tmp/dmd/steps-1")(batch_size=2, output_type="np")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from fastdiff.distill.common import (
    MANIFEST,
    DistillError,
    check_out,
    finish_run,
    fresh_copy,
    save_pipeline,
    start_run,
)
from fastdiff.distill.dmd_gan import GanHead, RealSamples
from fastdiff.distill.dmd_lora import FAKE, GENERATOR, MergedView, add_adapters, merged_state_dict
from fastdiff.distill.dmd_loss import dmd_loss_fn, teacher_pairs
from fastdiff.distill.pick import SNAPSHOTS, pick_snapshot, snapshotter
from fastdiff.distill.process import process_for
from fastdiff.distill.progressive import student_scheduler
from fastdiff.train.data import load_teacher, prompt_labels, real_latents, teacher_batches, training_data
from fastdiff.train.loop import ema_updater, train

METHODS = ("dmd", "sid")


def check_options(method, train_steps, batch, fake_updates, t_range, regression, guidance, ema_decay) -> None:
    """DistillError naming the first bad option (before anything is loaded or written)."""
    if method not in METHODS:
        raise DistillError(f"method must be one of {METHODS}, got {method!r}")
    if train_steps < 1 or batch < 1 or fake_updates < 1:
        raise DistillError(
            f"need --train-steps, --batch and --fake-updates >= 1, got {train_steps}, {batch}, {fake_updates}"
        )
    low, high = t_range
    if not 0 <= low < high <= 1:
        raise DistillError(f"--t-range must be 'low,high' with 0 <= low < high <= 1, got {low},{high}")
    if regression < 0:
        raise DistillError(f"--regression must be >= 0, got {regression}")
    if guidance is not None and guidance < 1:
        raise DistillError(f"--guidance must be >= 1, got {guidance}")
    if ema_decay is not None and not 0 < ema_decay < 1:
        raise DistillError(f"--ema-decay must be in (0, 1), got {ema_decay}")


def check_gan_options(gan: float, gan_d: float, gan_lr: float | None, gan_prompts: bool) -> None:
    """DistillError naming the first bad option of the GAN term."""
    if not (gan >= 0 and gan_d >= 0):
        raise DistillError(f"--gan and --gan-d must be >= 0, got {gan}, {gan_d}")
    if gan_lr is not None and not gan_lr > 0:
        raise DistillError(f"--gan-lr must be > 0, got {gan_lr}")
    if gan_prompts and not gan > 0:
        raise DistillError("--gan-prompts is an option of the GAN term: give --gan W > 0")


def gan_head(fake, fp, teacher_dir, batches, process, device, seed: int = 0, prompts: bool = False):
    """(head, real): DMD2's real/fake head on the fake score (``fastdiff.distill.dmd_gan``), and for a flow
    teacher (whose batches are its own samples) its training split in latent space (``RealSamples``), which the
    head reads with the unconditional input, or with ``prompts`` each with a pool prompt naming its label.
    DistillError without training images, or without the facts ``prompts`` needs."""
    real, missing = None, getattr(batches, "x0", None) is None
    if process.kind == "flow":
        real = real_samples(fp, teacher_dir, batches, prompts)
        missing = real is None or (batches.uncond is None and not prompts)  # unconditional: needs that input
    if missing:
        raise DistillError(
            "--gan tells the teacher's training images from the generator's: this teacher has none beside it "
            "(a digits build's eval/split.npz; a flow teacher also needs an unconditional input)"
        )
    _, cond, _ = batches.batch(torch.Generator().manual_seed(0))
    probe = {k: v[:1].to(device) if torch.is_tensor(v) else v for k, v in cond.items()}
    probe[batches.key] = torch.zeros((1, *batches.shape), device=device)
    probe["timestep"] = process.generator_timestep(1).to(device)
    return GanHead(fake, probe, seed=seed).to(device), real


def real_samples(fp, teacher_dir, batches, prompts: bool) -> RealSamples | None:
    """A flow teacher's training split for the head (None without one); with ``prompts``, each image's label and
    the pool prompts that name it (``fastdiff.train.data.prompt_labels``)."""
    latents = real_latents(fp, teacher_dir)
    if latents is None or not prompts:
        return None if latents is None else RealSamples(latents)
    labels = training_data(teacher_dir)[1]
    named = prompt_labels(fp.pipe, getattr(batches, "prompts", None))
    if labels is None or named is None:
        raise DistillError(
            f"--gan-prompts needs training labels and prompts whose labels are known; {type(fp.pipe).__name__} at "
            f"{teacher_dir} registers none (fastdiff.train.data.register_prompt_labels: digits-flow does)"
        )
    return RealSamples(latents, labels, named, batches.cond)


def check_lora(rank, init, ema_decay, process) -> None:
    """DistillError unless LoRA mode can train this teacher with these options."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise DistillError(f"--lora must be an integer rank >= 1, got {rank!r}")
    if init is not None or ema_decay is not None:
        raise DistillError(
            "--lora trains two adapters on the teacher's own weights: --init and --ema-decay need "
            "full mode (leave --lora out)"
        )
    if process.kind != process.generator_kind:
        raise DistillError(
            f"--lora needs a teacher that predicts what the one-step generator reads ({process.generator_kind}); "
            f"this one predicts {process.kind}: use full mode with --init of a one-step progressive student"
        )


def load_generator(fp, process, init):
    """The generator's starting weights: the teacher's (if it predicts what the generator does: v, or flow
    velocity) or a one-step student's (``init``)."""
    if init is None:
        if process.kind != process.generator_kind:
            raise DistillError(
                f"the teacher predicts {process.kind}; a one-step generator reads x0 at the last timestep, where "
                "that divides by sqrt(alpha-bar): start from a one-step progressive student instead "
                "(fastdiff distill progressive TEACHER P --to 1 --guidance G, then --init P/steps-1)"
            )
        return fresh_copy(fp.denoiser)
    init = Path(init)
    manifest = init / MANIFEST
    info = json.loads(manifest.read_text()) if manifest.is_file() else {}
    if info.get("steps") != 1 or info.get("sample_with", {}).get("guidance_scale") != 1.0:
        raise DistillError(
            f"--init {str(init)!r} is not a one-step student (its {MANIFEST} says steps="
            f"{info.get('steps')!r}); make one with fastdiff distill progressive --to 1"
        )
    cls = type(fp.denoiser)
    student = cls.from_pretrained(init, subfolder=fp.denoiser_name)
    keys = ("sample_size", "in_channels", "out_channels", "block_out_channels", "num_class_embeds")
    differs = [k for k in keys if student.config.get(k) != fp.denoiser.config.get(k)]
    if differs:
        raise DistillError(
            f"--init {str(init)!r} is a student of another teacher: its {differs[0]} is "
            f"{student.config.get(differs[0])!r}, the teacher's {fp.denoiser.config.get(differs[0])!r}"
        )
    return fresh_copy(student)


def dmd(
    teacher_dir,
    out,
    init=None,
    method: str = "dmd",
    guidance: float | None = None,
    train_steps: int = 1000,
    batch: int = 32,
    lr: float = 1e-5,
    fake_lr: float = 2e-5,
    fake_updates: int = 5,
    fake_warmup: int = 0,
    t_range: tuple[float, float] = (0.02, 0.98),
    regression: float = 0.0,
    pairs: int = 256,
    pair_steps: int = 50,
    sid_alpha: float = 1.2,
    ema_decay: float | None = None,
    resume: bool = False,
    seed: int = 0,
    save_every: int = 100,
    progress: bool = True,
    max_loss: float | None = None,
    stop_after: int | None = None,
    snapshot_every: int | None = None,
    selection_seeds: tuple[int, ...] = (0,),
    report_seeds: tuple[int, ...] = (1,),
    pick_images: int = 500,
    lora: int | None = None,
    gan: float = 0.0,
    gan_d: float = 1e-2,
    gan_lr: float | None = None,
    gan_prompts: bool = False,
) -> dict:
    """Distill ``teacher_dir`` (guided at ``guidance``, default 1) into a one-step student in ``OUT/steps-1``.

    ``stop_after`` ends this call after that many generator updates (checkpointed, no student saved): a
    time-boxed run that a later call with ``resume=True`` continues. With ``snapshot_every`` the student's
    weights are kept every that many updates and the saved student is the snapshot picked on
    ``selection_seeds`` and reported on ``report_seeds`` (``fastdiff.distill.pick``; ``pick_images`` each). With
    ``lora`` (a rank) the generator and the fake score are two LoRA adapters on the teacher's one copy of the
    weights (``fastdiff.distill.dmd_lora``): for teachers that predict v or flow velocity, without ``init``.
    ``gan`` > 0 adds DMD2's GAN term (``fastdiff.distill.dmd_gan``); its head learns at ``gan_lr`` (default
    ``fake_lr``) in the fake score's optimizer; with ``gan_prompts`` (flow teachers) it reads each training image
    with a prompt naming its label and the generator's samples with their own prompts."""
    t_range = tuple(float(v) for v in t_range)
    check_options(method, train_steps, batch, fake_updates, t_range, regression, guidance, ema_decay)
    check_gan_options(gan, gan_d, gan_lr, gan_prompts)
    shared = sorted(set(selection_seeds) & set(report_seeds))
    if snapshot_every and (shared or not selection_seeds or not report_seeds):
        raise DistillError(
            f"--selection-seeds {list(selection_seeds)} and --report-seeds {list(report_seeds)} "
            "must be non-empty and disjoint"
        )
    out = Path(out)
    command = {
        "command": "dmd",
        "teacher": str(Path(teacher_dir).resolve()),
        "init": str(Path(init).resolve()) if init else None,
        "method": method,
        "guidance": guidance,
        "train_steps": train_steps,
        "batch": batch,
        "lr": lr,
        "fake_lr": fake_lr,
        "fake_updates": fake_updates,
        "fake_warmup": fake_warmup,
        "t_range": list(t_range),
        "regression": regression,
        "pairs": pairs,
        "pair_steps": pair_steps,
        "sid_alpha": sid_alpha,
        "ema_decay": ema_decay,
        "seed": seed,
        "snapshot_every": snapshot_every,
        "lora": lora,
        "gan": gan,
        "gan_d": gan_d,
        **({"gan_lr": gan_lr} if gan_lr is not None else {}),  # absent when unset: older runs still resume
        **({"gan_prompts": True} if gan_prompts else {}),
    }
    fp = load_teacher(teacher_dir, allow_flow=True)
    process = process_for(fp.pipe.scheduler)
    flow = process.kind == "flow"
    if gan_prompts and not flow:  # refused before OUT is written
        raise DistillError(
            "--gan-prompts is for flow teachers: this teacher's head already reads each training image with its label"
        )
    if lora is not None:
        check_lora(lora, init, ema_decay, process)
    generator = load_generator(fp, process, init).requires_grad_(True) if lora is None else None
    check_out(out, command, resume)
    start_run(out, command)
    scale = float(guidance or 1.0)
    # flow: the conditioning of the teacher's own prompts (FlowBatches also samples them: 2 steps, unused here)
    batches = teacher_batches(fp, teacher_dir, batch, seed, guidance=scale, pool=max(batch, 64), steps=2)
    key = batches.key
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the device train() will use
    if lora is None:
        teacher = fp.denoiser.eval().requires_grad_(False)
        fake = fresh_copy(teacher).to(device).requires_grad_(True)
    else:  # one base: the pipeline's own denoiser, with the two adapters
        views = add_adapters(fp.denoiser.eval().to(device), lora, seed)
        teacher, fake, generator = views["teacher"], views[FAKE], views[GENERATOR]
    head, real = (None, None)
    if gan > 0:
        head, real = gan_head(fake, fp, teacher_dir, batches, process, device, seed, gan_prompts)
    groups = [{"params": list(fake.parameters())}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": gan_lr or fake_lr})
    fake_opt = torch.optim.AdamW(groups, lr=fake_lr, weight_decay=0.0)
    work = out / "train"
    work.mkdir(parents=True, exist_ok=True)
    pool = None
    if regression > 0:
        pool = teacher_pairs(process, teacher, batches, key, scale, pairs, pair_steps, seed, work / "pairs.pt")
    ema = fresh_copy(generator) if ema_decay else None
    hooks = [ema_updater(ema, generator, ema_decay)] if ema is not None else []
    if snapshot_every:
        kept = MergedView(fp.denoiser, GENERATOR) if lora is not None else (ema if ema is not None else generator)
        hooks.append(snapshotter(work / SNAPSHOTS, snapshot_every, kept))
    low, high = (max(0, round(v * (process.total - 1))) for v in t_range)
    loss_fn = dmd_loss_fn(
        process,
        key,
        batches,
        teacher,
        fake,
        fake_opt,
        scale,
        low,
        high,
        fake_updates,
        method,
        sid_alpha,
        regression,
        pool,
        fake_warmup,
        head,
        gan,
        gan_d,
        real,
    )
    report = train(
        generator,
        loss_fn,
        train_steps,
        lr=lr,
        out_dir=work,
        save_every=save_every,
        seed=seed,
        frozen=(teacher,),
        extra={"ema": ema} if ema is not None else None,
        state={"fake": fake, "fake_optimizer": fake_opt, **({"gan_head": head} if head is not None else {})},
        after_step=lambda step: [hook(step) for hook in hooks],
        progress=progress,
        schedule="constant",
        max_loss=max_loss,
        stop_after=stop_after,
        desc=f"{method} 1 step",
    )
    if head is not None:
        head.remove()
    if report["steps"] < train_steps:
        return {"out": None, "train": report}
    if lora is not None:
        student = type(fp.denoiser).from_config(fp.denoiser.config)
        student.load_state_dict(merged_state_dict(fp.denoiser, GENERATOR))
    else:
        student = (ema if ema is not None else generator).cpu()
    config = fp.pipe.scheduler.config
    scheduler = type(fp.pipe.scheduler).from_config(config) if flow else student_scheduler(config)
    info = {
        "method": method,
        "steps": 1,
        "load_accelerators": f"scheduler(name={'flow-euler' if flow else 'ddim'},steps=1)",
        "guidance_baked_in": scale,
        "sample_with": {"num_inference_steps": 1, "guidance_scale": 1.0},
        "ema": ema_decay is not None,
        "lora": lora,
        "train": report,
    }
    snapshots = sorted((work / SNAPSHOTS).glob("step-*.safetensors"))
    if snapshot_every and snapshots:
        from safetensors.torch import load_file

        record = pick_snapshot(
            teacher_dir, snapshots, scheduler, selection_seeds, report_seeds, pick_images, progress=progress
        )
        with torch.no_grad():
            student.load_state_dict(load_file(work / SNAPSHOTS / f"{record['choice']}.safetensors"))
        info["selection"] = record
        if "report" in record:  # what fastdiff.distill.validate records: this student is measured at 1 step
            info.update(measured={"1": {"steps": 1, **record["report"][0]}}, validated=[1])
    save_pipeline(fp, student, scheduler, out / "steps-1", info, teacher_dir)
    shutil.copy(work / "loss.csv", out / "steps-1" / "loss.csv")
    finish_run(out, {"train": report})
    return {"out": str(out / "steps-1"), "train": report}
