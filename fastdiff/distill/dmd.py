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
``regression`` > 0 adds the MSE to the teacher's own ODE samples of ``pairs`` fixed noises (DDIM
``pair_steps`` steps, generated once into ``OUT/pairs.pt``).

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

from fastdiff.core.models import model_prediction
from fastdiff.distill.common import (
    MANIFEST,
    Batches,
    DistillError,
    alphas,
    check_out,
    finish_run,
    fresh_copy,
    guided,
    load_teacher,
    save_pipeline,
    start_run,
    to_eps_x0,
)
from fastdiff.distill.pick import SNAPSHOTS, pick_snapshot, snapshotter
from fastdiff.distill.progressive import student_scheduler
from fastdiff.train.inputs import denoiser_output, to_device
from fastdiff.train.loop import ema_updater, train

METHODS = ("dmd", "sid")


def check_options(method, train_steps, batch, fake_updates, t_range, regression, guidance, ema_decay) -> None:
    """DistillError naming the first bad option (before anything is loaded or written)."""
    if method not in METHODS:
        raise DistillError(f"method must be one of {METHODS}, got {method!r}")
    if train_steps < 1 or batch < 1 or fake_updates < 1:
        raise DistillError(f"need --train-steps, --batch and --fake-updates >= 1, got {train_steps}, {batch}, "
                           f"{fake_updates}")  # fmt: skip
    low, high = t_range
    if not 0 <= low < high <= 1:
        raise DistillError(f"--t-range must be 'low,high' with 0 <= low < high <= 1, got {low},{high}")
    if regression < 0:
        raise DistillError(f"--regression must be >= 0, got {regression}")
    if guidance is not None and guidance < 1:
        raise DistillError(f"--guidance must be >= 1, got {guidance}")
    if ema_decay is not None and not 0 < ema_decay < 1:
        raise DistillError(f"--ema-decay must be in (0, 1), got {ema_decay}")


def load_generator(fp, teacher_kind: str, init):
    """The generator's starting weights: the teacher's (if it predicts v) or a one-step student's (``init``)."""
    if init is None:
        if teacher_kind != "v_prediction":
            raise DistillError(
                f"the teacher predicts {teacher_kind}; a one-step generator reads x0 at the last timestep, where "
                "that divides by sqrt(alpha-bar): start from a one-step progressive student instead "
                "(fastdiff distill progressive TEACHER P --to 1 --guidance G, then --init P/steps-1)"
            )
        return fresh_copy(fp.denoiser)
    init = Path(init)
    manifest = init / MANIFEST
    info = json.loads(manifest.read_text()) if manifest.is_file() else {}
    if info.get("steps") != 1 or info.get("sample_with", {}).get("guidance_scale") != 1.0:
        raise DistillError(f"--init {str(init)!r} is not a one-step student (its {MANIFEST} says steps="
                           f"{info.get('steps')!r}); make one with fastdiff distill progressive --to 1")  # fmt: skip
    cls = type(fp.denoiser)
    student = cls.from_pretrained(init, subfolder=fp.denoiser_name)
    keys = ("sample_size", "in_channels", "out_channels", "block_out_channels", "num_class_embeds")
    differs = [k for k in keys if student.config.get(k) != fp.denoiser.config.get(k)]
    if differs:
        raise DistillError(f"--init {str(init)!r} is a student of another teacher: its {differs[0]} is "
                           f"{student.config.get(differs[0])!r}, the teacher's {fp.denoiser.config.get(differs[0])!r}")  # fmt: skip
    return fresh_copy(student)


def teacher_pairs(fp, batches, teacher, kind, scale, a_all, count, steps, seed, path) -> dict:
    """``count`` (noise, teacher sample, conditioning) pairs by DDIM ``steps`` steps, saved to ``path`` once."""
    if path.is_file():
        return torch.load(path, weights_only=False)
    from fastdiff.distill.common import trailing_grid

    g = torch.Generator().manual_seed(seed + 7919)
    grid = torch.as_tensor(trailing_grid(steps, a_all.numel() - 1))
    noises, samples, conds = [], [], []
    for _ in range(-(-count // batches.size)):
        _, cond, uncond = batches.batch(g)
        z = torch.randn((batches.size, *batches.shape), generator=g)
        x = z
        with torch.no_grad():
            for i, t in enumerate(grid):
                a = a_all[t].view(1, 1, 1, 1)
                tt = torch.full((x.shape[0],), int(t))
                w = torch.full((x.shape[0],), scale)
                eps, x0 = guided(teacher, x, tt, cond, uncond if scale > 1 else None, w, a, kind)
                nxt = a_all[grid[i + 1]] if i + 1 < len(grid) else torch.tensor(1.0)
                x = nxt.sqrt() * x0 + (1 - nxt).sqrt() * eps
        noises.append(z)
        samples.append(x)
        conds.append(cond)
    pairs = {"noise": torch.cat(noises)[:count], "sample": torch.cat(samples)[:count],
             "cond": {k: torch.cat([c[k] for c in conds])[:count] if torch.is_tensor(conds[0][k]) else conds[0][k]
                      for k in conds[0]}}  # fmt: skip
    torch.save(pairs, path)
    return pairs


def _target(kind: str, x0, noise, a):
    if kind == "epsilon":
        return noise
    if kind == "sample":
        return x0
    return a.sqrt() * noise - (1 - a).sqrt() * x0  # v_prediction


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
) -> dict:
    """Distill ``teacher_dir`` (guided at ``guidance``, default 1) into a one-step student in ``OUT/steps-1``.

    ``stop_after`` ends this call after that many generator updates (checkpointed, no student saved): a
    time-boxed run that a later call with ``resume=True`` continues. With ``snapshot_every`` the student's
    weights are kept every that many updates and the saved student is the snapshot picked on
    ``selection_seeds`` and reported on ``report_seeds`` (``fastdiff.distill.pick``; ``pick_images`` each)."""
    t_range = tuple(float(v) for v in t_range)
    check_options(method, train_steps, batch, fake_updates, t_range, regression, guidance, ema_decay)
    out = Path(out)
    command = {"command": "dmd", "teacher": str(Path(teacher_dir).resolve()),
               "init": str(Path(init).resolve()) if init else None, "method": method, "guidance": guidance,
               "train_steps": train_steps, "batch": batch, "lr": lr, "fake_lr": fake_lr,
               "fake_updates": fake_updates, "t_range": list(t_range), "regression": regression, "pairs": pairs,
               "pair_steps": pair_steps, "sid_alpha": sid_alpha, "ema_decay": ema_decay, "seed": seed,
               "snapshot_every": snapshot_every}  # fmt: skip
    fp = load_teacher(teacher_dir)
    kind = model_prediction(fp.pipe.scheduler)
    generator = load_generator(fp, kind, init).requires_grad_(True)
    check_out(out, command, resume)
    start_run(out, command)
    scale = float(guidance or 1.0)
    config = fp.pipe.scheduler.config
    total = config.num_train_timesteps
    a_all = alphas(config)
    batches = Batches(fp, teacher_dir, batch, seed)
    teacher = fp.denoiser.eval().requires_grad_(False)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the device train() will use
    fake = fresh_copy(teacher).to(device).requires_grad_(True)
    fake_opt = torch.optim.AdamW(fake.parameters(), lr=fake_lr, weight_decay=0.0)
    work = out / "train"
    work.mkdir(parents=True, exist_ok=True)
    pool = None
    if regression > 0:
        pool = teacher_pairs(
            fp, batches, teacher, kind, scale, a_all, pairs, pair_steps, seed, work / "pairs.pt"
        )
    ema = fresh_copy(generator) if ema_decay else None
    hooks = [ema_updater(ema, generator, ema_decay)] if ema is not None else []
    if snapshot_every:
        hooks.append(snapshotter(work / SNAPSHOTS, snapshot_every, ema if ema is not None else generator))
    low, high = (max(0, round(v * (total - 1))) for v in t_range)
    loss_fn = _loss(batches, teacher, fake, fake_opt, kind, scale, a_all, total, low, high, fake_updates, method,
                    sid_alpha, regression, pool)  # fmt: skip
    report = train(generator, loss_fn, train_steps, lr=lr, out_dir=work, save_every=save_every, seed=seed,
                   frozen=(teacher,), extra={"ema": ema} if ema is not None else None,
                   state={"fake": fake, "fake_optimizer": fake_opt},
                   after_step=lambda step: [hook(step) for hook in hooks],
                   progress=progress, schedule="constant", max_loss=max_loss, stop_after=stop_after,
                   desc=f"{method} 1 step")  # fmt: skip
    if report["steps"] < train_steps:
        return {"out": None, "train": report}
    student = (ema if ema is not None else generator).cpu()
    info = {"method": method, "steps": 1, "load_accelerators": "scheduler(name=ddim,steps=1)",
            "guidance_baked_in": scale, "sample_with": {"num_inference_steps": 1, "guidance_scale": 1.0},
            "ema": ema_decay is not None, "train": report}  # fmt: skip
    snapshots = sorted((work / SNAPSHOTS).glob("step-*.safetensors"))
    if snapshot_every and snapshots:
        from safetensors.torch import load_file

        record = pick_snapshot(teacher_dir, snapshots, student_scheduler(config), selection_seeds, report_seeds,
                               pick_images, progress=progress)  # fmt: skip
        with torch.no_grad():
            student.load_state_dict(load_file(work / SNAPSHOTS / f"{record['choice']}.safetensors"))
        info["selection"] = record
        if "report" in record:
            info["validated"] = {"1": record["report"]}
    save_pipeline(fp, student, student_scheduler(config), out / "steps-1", info, teacher_dir)
    shutil.copy(work / "loss.csv", out / "steps-1" / "loss.csv")
    finish_run(out, {"train": report})
    return {"out": str(out / "steps-1"), "train": report}


def _loss(batches, teacher, fake, fake_opt, kind, scale, a_all, total, low, high, fake_updates, method, sid_alpha,
          regression, pool):  # fmt: skip
    last = total - 1

    def generate(gen, z, cond, device):
        t = torch.full((z.shape[0],), last, device=device)
        v = denoiser_output(gen, {"sample": z, "timestep": t, **cond})
        return to_eps_x0(v, z, a_all[last].to(device).view(1, 1, 1, 1), "v_prediction")[1]

    def noised(x0, g, device, lo, hi):
        t = torch.randint(lo, hi + 1, (x0.shape[0],), generator=g).to(device)
        noise = torch.randn(x0.shape, generator=g).to(device)
        a = a_all.to(device)[t].view(-1, 1, 1, 1)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, a, noise

    def loss_fn(gen, g, device):
        _, cond, uncond = batches.batch(g)
        cond, uncond = to_device(cond, device), (to_device(uncond, device) if scale > 1 else None)
        fake_losses = []
        for _ in range(fake_updates):  # the fake score follows the generator (two time-scale)
            with torch.no_grad():
                x_g = generate(
                    gen, torch.randn((batches.size, *batches.shape), generator=g).to(device), cond, device
                )
            x_t, t, a, noise = noised(x_g, g, device, 0, last)
            pred = denoiser_output(fake, {"sample": x_t, "timestep": t, **cond})[:, : x_t.shape[1]]
            f_loss = torch.nn.functional.mse_loss(pred, _target(kind, x_g, noise, a))
            fake_opt.zero_grad(set_to_none=True)
            f_loss.backward()
            fake_opt.step()
            fake_losses.append(f_loss.item())
        fake.requires_grad_(False)
        try:
            x_g = generate(
                gen, torch.randn((batches.size, *batches.shape), generator=g).to(device), cond, device
            )
            w = torch.full((x_g.shape[0],), scale, device=device)
            if method == "dmd":
                with torch.no_grad():
                    x_t, t, a, _ = noised(x_g.detach(), g, device, low, high)
                    real = guided(teacher, x_t, t, cond, uncond, w, a, kind)[1]
                    fake_x0 = guided(fake, x_t, t, cond, None, w, a, kind)[1]
                    norm = (x_g - real).abs().mean(dim=(1, 2, 3), keepdim=True).clamp_min(1e-5)
                    grad = torch.nan_to_num((fake_x0 - real) / norm)
                loss = 0.5 * torch.nn.functional.mse_loss(x_g, (x_g - grad).detach())
            else:  # SiD: through both denoisers' inputs, their weights fixed
                x_t, t, a, _ = noised(x_g, g, device, low, high)
                real = guided(teacher, x_t, t, cond, uncond, w, a, kind)[1]
                fake_x0 = guided(fake, x_t, t, cond, None, w, a, kind)[1]
                with torch.no_grad():
                    norm = (x_g - real).abs().mean(dim=(1, 2, 3), keepdim=True).clamp_min(1e-5)
                gap = real - fake_x0
                loss = (gap * ((real - x_g) - sid_alpha * gap) / norm).mean()
        finally:
            fake.requires_grad_(True)
        shown = {"fake": sum(fake_losses) / len(fake_losses), method: loss.item()}
        if pool is not None:
            i = torch.randint(0, pool["noise"].shape[0], (batches.size,), generator=g)
            pc = to_device({k: v[i] if torch.is_tensor(v) else v for k, v in pool["cond"].items()}, device)
            reg = torch.nn.functional.mse_loss(generate(gen, pool["noise"][i].to(device), pc, device),
                                               pool["sample"][i].to(device))  # fmt: skip
            shown["regression"] = reg.item()
            loss = loss + regression * reg
        return loss, shown

    return loss_fn
