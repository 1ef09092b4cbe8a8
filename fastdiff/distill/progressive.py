"""Progressive distillation (Salimans & Ho 2022): halve the sampling steps per round, down to one.

Each round trains a student (initialised from its teacher) so that one DDIM step of the student from ``t``
to ``t''`` lands where two DDIM steps of the teacher (``t -> t' -> t''``) land. Timesteps follow DDIM's
``trailing`` grid, which nests exactly from N to N/2 steps for powers of two. The student predicts ``v``
(the paper's parameterisation: stable down to one step, where epsilon-prediction divides by
``sqrt(alpha_bar)``); its x0 is fitted to the paper's target ``x~ = (z_t'' - (s_t''/s_t) z_t) /
(a_t'' - (s_t''/s_t) a_t)`` with the "SNR+1" weight (the MSE in v space). An epsilon (or sample)
teacher is read through its own parameterisation, so the first student also learns the switch to v.
With ``guidance > 1`` the first teacher is guided (classifier-free) and every student bakes that guidance
in: sample them with ``guidance_scale=1`` (one batch per step).

Every round's student is saved as ``OUT/steps-N`` (a pipeline directory with a v-prediction DDIM
``trailing`` scheduler) whose ``fastdiff_distill.json`` says ``scheduler(name=ddim,steps=N)``; the training
checkpoints live in ``OUT/train-steps-N`` until the round is saved, so a killed run resumes mid-round.

Example::

    from fastdiff.distill.progressive import progressive
    from fastdiff.distill.common import load_student
    from fastdiff.zoo import build

    progressive(build("tiny-ddpm", "/tmp/tiny-ddpm"), "/tmp/prog", start=8, end=2, steps_per_round=20)
    images = load_student("/tmp/prog/steps-2")(batch_size=2, output_type="np").images
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from fastdiff.core.models import model_prediction
from fastdiff.distill.common import (
    DistillError,
    alphas,
    check_out,
    finish_run,
    fresh_copy,
    guided,
    save_pipeline,
    start_run,
    to_eps_x0,
    trailing_grid,
)
from fastdiff.distill.flow import check_flow_teacher, flow_grid, flow_round_loss
from fastdiff.distill.validate import validate_student
from fastdiff.train.data import load_teacher, teacher_batches
from fastdiff.train.inputs import denoiser_output, to_device
from fastdiff.train.loop import train


def check_steps(start: int, end: int) -> None:
    """DistillError unless ``start`` and ``end`` are powers of two with ``start > end >= 1``."""
    for name, n in (("--from", start), ("--to", end)):
        if not isinstance(n, int) or n < 1 or n & (n - 1):
            raise DistillError(f"{name} must be a power of two (1, 2, 4, ...), got {n}")
    if start <= end:
        raise DistillError(f"--from ({start}) must be above --to ({end})")


def student_scheduler(config):
    """The students' sampler: DDIM on the trailing grid, v-prediction, ending at the clean image."""
    from diffusers import DDIMScheduler

    from fastdiff.schedulers.presets import explicit_config

    return DDIMScheduler.from_config(
        explicit_config(config, "DDIMScheduler"),
        prediction_type="v_prediction",
        clip_sample=False,
        set_alpha_to_one=True,
        timestep_spacing="trailing",
    )


def progressive(
    teacher_dir,
    out,
    start: int = 32,
    end: int = 1,
    steps_per_round: int = 1000,
    batch: int = 32,
    lr: float = 1e-4,
    guidance: float | None = None,
    resume: bool = False,
    seed: int = 0,
    save_every: int = 100,
    accumulate: int = 1,
    gradient_checkpointing: bool = False,
    progress: bool = True,
    pool: int = 256,
) -> dict:
    """Distill ``teacher_dir`` (sampled with DDIM ``start`` steps) into students of start/2 ... ``end`` steps.

    A flow-matching teacher (``fastdiff.distill.flow``) is distilled on its own flow Euler grid from ``pool``
    samples of its own; students keep its scheduler and predict velocity."""
    check_steps(start, end)
    if steps_per_round < 1 or batch < 1:
        raise DistillError(f"need --steps-per-round >= 1 and --batch >= 1, got {steps_per_round}, {batch}")
    out = Path(out)
    command = {
        "command": "progressive",
        "teacher": str(Path(teacher_dir).resolve()),
        "from": start,
        "to": end,
        "steps_per_round": steps_per_round,
        "batch": batch,
        "lr": lr,
        "guidance": guidance,
        "seed": seed,
        "accumulate": accumulate,
    }
    if pool < batch:
        raise DistillError(f"--pool ({pool}) must hold at least one batch ({batch})")
    fp = load_teacher(teacher_dir, allow_flow=True)
    flow = model_prediction(fp.pipe.scheduler) == "flow"
    if flow:
        command["pool"] = pool
    check_out(out, command, resume)
    scale = float(guidance if guidance is not None else 1.0)
    if scale < 1:
        raise DistillError(f"--guidance must be >= 1, got {scale}")
    if flow:
        check_flow_teacher(fp)
    start_run(out, command)
    config = fp.pipe.scheduler.config
    batches = teacher_batches(fp, teacher_dir, batch, seed, guidance=scale, pool=pool, steps=2 * start)
    a_all, total = None if flow else alphas(config), config.num_train_timesteps
    teacher, kind, uncond_on = fp.denoiser.eval(), model_prediction(fp.pipe.scheduler), scale > 1
    rounds, n = {}, start // 2
    while n >= end:
        round_dir = out / f"steps-{n}"
        if (round_dir / "model_index.json").is_file():  # done in an earlier (resumed) run
            student = type(teacher).from_pretrained(round_dir, subfolder=fp.denoiser_name).eval()
        else:
            student = fresh_copy(teacher).requires_grad_(True)
            if flow:
                grid = flow_grid(fp.pipe.scheduler, n)
                loss_fn = flow_round_loss(batches, teacher, scale if uncond_on else 1.0, grid, total)
            else:
                loss_fn = _round_loss(batches, teacher, kind, uncond_on, scale, a_all, total, n)
            work = out / f"train-steps-{n}"
            report = train(
                student,
                loss_fn,
                steps_per_round,
                lr=lr,
                out_dir=work,
                save_every=save_every,
                seed=seed + n,
                accumulate=accumulate,
                frozen=(teacher,),
                progress=progress,
                gradient_checkpointing=gradient_checkpointing,
                schedule="constant",
                desc=f"progressive {2 * n}->{n}",
            )
            sampler = "flow-euler" if flow else "ddim"
            info = {
                "method": "progressive",
                "steps": n,
                "teacher_steps": 2 * n,
                "load_accelerators": f"scheduler(name={sampler},steps={n})",
                "guidance_baked_in": scale,
                "sample_with": {"num_inference_steps": n, "guidance_scale": 1.0},
                "train": report,
            }
            scheduler = type(fp.pipe.scheduler).from_config(config) if flow else student_scheduler(config)
            save_pipeline(fp, student.cpu(), scheduler, round_dir, info, teacher_dir)
            shutil.move(str(work / "loss.csv"), str(round_dir / "loss.csv"))
            shutil.rmtree(work)
            validate_student(round_dir, teacher_dir, steps=(n,))
            rounds[n] = report
        teacher, kind, uncond_on = (
            student.eval().requires_grad_(False),
            "flow" if flow else "v_prediction",
            False,
        )
        n //= 2
    finish_run(out, {"rounds": rounds})
    return {"out": str(out), "rounds": rounds}


def _round_loss(batches, teacher, kind, uncond_on, scale, a_all, total, n):
    grid = torch.as_tensor(trailing_grid(n, total))
    fine = torch.as_tensor(trailing_grid(2 * n, total))
    ends = torch.cat([grid[1:], torch.tensor([-1])])  # -1: alpha-bar 1, the clean image

    def loss_fn(student, g, device):
        x0, cond, uncond = batches.batch(g)
        j = torch.randint(0, n, (x0.shape[0],), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        t, mid, end = grid[j].to(device), fine[2 * j + 1].to(device), ends[j].to(device)
        x0, noise, cond = x0.to(device), noise.to(device), to_device(cond, device)
        uncond = to_device(uncond, device) if uncond_on else None
        a = a_all.to(device)
        at, am, ae = (a[s].view(-1, 1, 1, 1) for s in (t, mid, end))
        z = at.sqrt() * x0 + (1 - at).sqrt() * noise
        w = torch.full((x0.shape[0],), scale, device=device)
        with torch.no_grad():  # two DDIM steps of the teacher: t -> mid -> end
            eps, xh = guided(teacher, z, t, cond, uncond, w, at, kind)
            z_mid = am.sqrt() * xh + (1 - am).sqrt() * eps
            eps, xh = guided(teacher, z_mid, mid, cond, uncond, w, am, kind)
            z_end = ae.sqrt() * xh + (1 - ae).sqrt() * eps
            ratio = (1 - ae).sqrt() / (1 - at).sqrt()
            target = (z_end - ratio * z) / (ae.sqrt() - ratio * at.sqrt())
        v = denoiser_output(student, {"sample": z, "timestep": t, **cond})
        _, x0_student = to_eps_x0(v, z, at, "v_prediction")
        return ((x0_student - target) ** 2 / (1 - at)).mean()  # SNR+1 weight: the MSE in v space

    return loss_fn
