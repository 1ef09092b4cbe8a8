"""Consistency distillation as in latent consistency models (LCM; Luo et al. 2023), full or LoRA.

Follows diffusers' ``examples/consistency_distillation`` scripts: timesteps on the teacher's skipping-step
grid ``t_n = n*K - 1`` (``skip`` = K); one step of the (guided) teacher from ``t_n`` to ``t_n - K`` by DDIM or
DPM-Solver++(2S) (``solver="dpm"``: a second teacher call at the log-SNR midpoint, as LCM's augmented solvers);
the student at ``t_n`` and a target network at ``t_n - K`` both go through LCM's boundary-condition
parameterisation ``f(x, t) = c_skip(t) x + c_out(t) x0(x, t)`` (sigma_data 0.5, timestep scaling 10, as in
diffusers' ``LCMScheduler``); the loss is pseudo-Huber (``huber_c``) or L2 between the two.

- Full student: the target is an EMA of the student (``ema_decay``), checkpointed with it. With a guidance
  range ``a < b`` on a ``UNet2DConditionModel`` the student gets a w-embedding (``time_cond_proj_dim``, zero-
  initialised, so it starts as the teacher) and Stable Diffusion pipelines feed it ``guidance_scale`` with one
  batch per step. Saved as a pipeline directory (OUT) with an ``LCMScheduler`` on the training grid.
- LoRA student (``lora=RANK``, peft): only the adapter trains and, as in diffusers' LCM-LoRA script, the
  target is the student itself without gradients. Saved as a peft adapter directory (OUT) for
  ``lcm-lora(path=OUT)``.

Without a w-embedding the guidance (a fixed scale, or one drawn per sample from the range) is baked in:
sample the student with ``guidance_scale=1``.

Example::

    from fastdiff.distill.consistency import consistency
    from fastdiff.zoo import build

    teacher = build("tiny-ddpm", "/tmp/tiny-ddpm")
    consistency(teacher, "/tmp/lcm-lora", lora=4, train_steps=20)
    # FastPipeline.from_pretrained(teacher, accelerators="lcm-lora(path=/tmp/lcm-lora)")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from fastdiff.distill.common import (
    MANIFEST,
    DistillError,
    alphas,
    check_out,
    default_guidance,
    finish_run,
    fresh_copy,
    guided,
    parse_guidance,
    start_run,
    to_eps_x0,
)
from fastdiff.distill.validate import validate_student
from fastdiff.train.data import load_teacher, teacher_batches
from fastdiff.train.inputs import denoiser_output, to_device
from fastdiff.train.loop import train

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# LoRA targets of diffusers' LCM-LoRA script (those the model has are used).
LORA_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "proj_in",
    "proj_out",
    "ff.net.0.proj",
    "ff.net.2",
    "conv1",
    "conv2",
    "conv_shortcut",
    "downsamplers.0.conv",
    "upsamplers.0.conv",
    "time_emb_proj",
]
SIGMA_DATA, TIMESTEP_SCALING = 0.5, 10.0  # LCMScheduler's defaults


def boundary_scalings(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_skip, c_out) of LCMScheduler.get_scalings_for_boundary_condition_discrete, batched, shape (B,1,1,1)."""
    scaled = t.float().view(-1, 1, 1, 1) * TIMESTEP_SCALING
    c_skip = SIGMA_DATA**2 / (scaled**2 + SIGMA_DATA**2)
    return c_skip, scaled / (scaled**2 + SIGMA_DATA**2).sqrt()


def student_scheduler(config, skip: int):
    """LCMScheduler whose inference timesteps lie on the training grid (original steps = T // skip)."""
    from diffusers import LCMScheduler

    from fastdiff.schedulers.presets import explicit_config

    return LCMScheduler.from_config(
        explicit_config(config, "LCMScheduler"),
        original_inference_steps=config.num_train_timesteps // skip,
        clip_sample=False,
    )


def consistency(
    teacher_dir,
    out,
    lora: int | None = None,
    guidance_range: str | tuple[float, float] | None = None,
    skip: int = 20,
    train_steps: int = 1000,
    batch: int = 32,
    lr: float = 1e-4,
    loss: str = "huber",
    huber_c: float = 0.001,
    ema_decay: float = 0.95,
    sample_steps: int = 4,
    w_embedding_dim: int = 256,
    solver: str = "ddim",
    resume: bool = False,
    seed: int = 0,
    save_every: int = 100,
    accumulate: int = 1,
    gradient_checkpointing: bool = False,
    progress: bool = True,
) -> dict:
    """Distill ``teacher_dir`` into a consistency student saved at ``out``; returns the run's report."""
    guidance = parse_guidance(
        ",".join(map(str, guidance_range)) if isinstance(guidance_range, tuple) else guidance_range
    )
    if lora is not None and lora < 1:
        raise DistillError(f"--lora RANK must be >= 1, got {lora}")
    if solver not in SOLVERS:
        raise DistillError(f"--solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    if loss not in ("huber", "l2"):
        raise DistillError(f"--loss must be huber or l2, got {loss!r}")
    if train_steps < 1 or batch < 1 or not 0 <= ema_decay < 1:
        raise DistillError(
            f"need train steps >= 1, batch >= 1, 0 <= ema decay < 1; got {train_steps}, {batch}, {ema_decay}"
        )
    out = Path(out)
    command = {
        "command": "consistency",
        "teacher": str(Path(teacher_dir).resolve()),
        "lora": lora,
        "guidance_range": guidance,
        "skip": skip,
        "train_steps": train_steps,
        "batch": batch,
        "lr": lr,
        "loss": loss,
        "seed": seed,
        "accumulate": accumulate,
        **({"solver": solver} if solver != "ddim" else {}),
    }
    check_out(out, command, resume)
    fp = load_teacher(teacher_dir)
    config = fp.pipe.scheduler.config
    total = config.num_train_timesteps
    if not 1 <= skip <= total // max(sample_steps, 1) or sample_steps < 1:
        raise DistillError(
            f"--skip must be in [1, {total // max(sample_steps, 1)}] for {sample_steps} sampling "
            f"steps over {total} training timesteps, got {skip}"
        )
    low, high = guidance or (default_guidance(fp),) * 2
    teacher = fp.denoiser.eval()
    embed = lora is None and high > low
    if embed and type(teacher).__name__ != "UNet2DConditionModel":
        raise DistillError(
            f"a guidance range needs a w-embedding, which {type(teacher).__name__} cannot take; "
            "give one scale (--guidance-range a) or use --lora"
        )
    if embed and not hasattr(fp.pipe, "get_guidance_scale_embedding"):
        raise DistillError(f"{type(fp.pipe).__name__} cannot feed a guidance embedding; give one scale")
    manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
    if manifest.get("done"):
        return manifest  # an earlier run of this command finished
    start_run(out, command)
    batches = teacher_batches(fp, teacher_dir, batch, seed)
    if lora is None:
        student = fresh_copy(teacher, **({"time_cond_proj_dim": w_embedding_dim} if embed else {}))
        student.requires_grad_(True)
        target = fresh_copy(student)
        extra = {"ema": target}
    else:
        student, lora_config = _with_lora(fresh_copy(teacher), lora)
        target, extra = student, {}  # LCM-LoRA: the online student, without gradients, gives the target
    embedding = (lambda w: fp.pipe.get_guidance_scale_embedding(w, embedding_dim=w_embedding_dim)) if embed else None
    loss_fn = _loss(batches, teacher, target, config, skip, (low, high), embedding, loss, huber_c, solver)

    def ema_update(step):
        if lora is None:
            with torch.no_grad():
                for e, p in zip(target.parameters(), student.parameters()):
                    e.lerp_(p, 1 - ema_decay)

    work = out / "train"
    report = train(
        student,
        loss_fn,
        train_steps,
        lr=lr,
        out_dir=work,
        save_every=save_every,
        seed=seed,
        accumulate=accumulate,
        frozen=(teacher,),
        extra=extra,
        after_step=ema_update,
        gradient_checkpointing=gradient_checkpointing,
        progress=progress,
        schedule="constant",
        desc="consistency",
    )
    student.cpu().eval()
    info = {
        "method": "consistency",
        "solver": solver,
        "skip": skip,
        "steps": sample_steps,
        "guidance_range": [low, high],
        "w_embedding": embed,
        "original_inference_steps": total // skip,
        "train": report,
        "sample_with": {
            "num_inference_steps": sample_steps,
            **({} if embed or not batches.uncond else {"guidance_scale": 1.0}),
        },
    }
    if lora is None:
        info["load_accelerators"] = f"scheduler(name=lcm,steps={sample_steps})"
        _save_full(fp, student, student_scheduler(config, skip), out)
    else:
        info.update(lora_rank=lora, load_with=f"lcm-lora(path={out.resolve()})")
        _save_adapter(student, lora_config, out)
    if (Path(teacher_dir) / "eval").is_dir() and lora is None:  # the digits reference's classifier and split
        shutil.copytree(Path(teacher_dir) / "eval", out / "eval", dirs_exist_ok=True)
    shutil.move(str(work / "loss.csv"), str(out / "loss.csv"))
    shutil.rmtree(work)
    finish_run(out, info)
    counts = sorted(n for n in {1, 2, 4, 8, sample_steps} if n <= total // skip)
    validate_student(out, teacher_dir, steps=counts)  # records which of these counts the student is good for
    return json.loads((out / MANIFEST).read_text())


def ddim_solver(a_all):
    """One DDIM step t -> s of a teacher ``model(x, t, alpha_bar) -> (eps, x0)``."""

    def solve(z, t, s, at, as_, model):
        eps, x0 = model(z, t, at)
        return as_.sqrt() * x0 + (1 - as_).sqrt() * eps

    return solve


def dpm_solver(a_all):
    """One DPM-Solver++(2S) step t -> s (Lu et al. 2022): the teacher also at the log-SNR midpoint.

    The midpoint is the training timestep between t and s whose log-SNR is nearest the middle (the teacher
    only knows integer timesteps); with no timestep strictly between them it is a DDIM step.
    """
    lam = 0.5 * (a_all.double().log() - (1 - a_all.double()).clamp_min(1e-20).log())  # log(alpha/sigma)

    def solve(z, t, s, at, as_, model):
        eps, x0 = model(z, t, at)
        sig_t, sig_s = (1 - at).sqrt(), (1 - as_).sqrt()
        lt, ls = lam.to(z.device)[t], lam.to(z.device)[s]
        h = (ls - lt).view(-1, 1, 1, 1).float()
        mids = torch.stack([_nearest_between(lam, int(a), int(b)) for a, b in zip(t.tolist(), s.tolist())])
        m = mids.to(t.device)
        ok = ((m < t) & (m > s)).view(-1, 1, 1, 1)
        am = a_all.to(z.device)[m].view(-1, 1, 1, 1)
        sig_m = (1 - am).sqrt()
        hm = (lam.to(z.device)[m] - lt).view(-1, 1, 1, 1).float()
        z_m = (sig_m / sig_t) * z - am.sqrt() * torch.expm1(-hm) * x0
        _, x0_m = model(z_m, m, am)
        r = (hm / h).clamp_min(1e-6)
        d = torch.where(ok, (1 - 1 / (2 * r)) * x0 + x0_m / (2 * r), x0)
        return (sig_s / sig_t) * z - as_.sqrt() * torch.expm1(-h) * d

    return solve


def _nearest_between(lam: torch.Tensor, t: int, s: int) -> torch.Tensor:
    if t - s < 2:
        return torch.tensor(t)
    inner = torch.arange(s + 1, t)
    middle = 0.5 * (lam[t] + lam[s])
    return inner[(lam[inner] - middle).abs().argmin()]


SOLVERS = {"ddim": ddim_solver, "dpm": dpm_solver}


def present_targets(module, candidates) -> list[str]:
    """The LoRA target names among ``candidates`` that ``module`` has (as a name or a name's last parts)."""
    names = {name for name, _ in module.named_modules()}
    return [t for t in candidates if any(n == t or n.endswith("." + t) for n in names)]


def _with_lora(unet, rank: int):
    from peft import LoraConfig, inject_adapter_in_model

    targets = present_targets(unet, LORA_TARGETS)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=True)
    unet.requires_grad_(False)
    inject_adapter_in_model(config, unet)  # LoRA B starts at zero: the student starts as the teacher
    return unet, config


def _save_full(fp, student, scheduler, out: Path) -> None:
    pipe, name = fp.pipe, fp.denoiser_name
    original = {name: getattr(pipe, name), "scheduler": pipe.scheduler}
    pipe.register_modules(**{name: student, "scheduler": scheduler})
    try:
        pipe.save_pretrained(out, safe_serialization=True)
    finally:
        pipe.register_modules(**original)


def _save_adapter(student, config, out: Path) -> None:
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(student)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, out / ADAPTER_WEIGHTS)
    config.save_pretrained(out)


def _loss(batches, teacher, target, config, skip, guidance, embedding, kind_of_loss, huber_c, solver="ddim"):
    a_all, kind = alphas(config), config.prediction_type
    solve = SOLVERS[solver](a_all)
    grid = torch.arange(1, config.num_train_timesteps // skip + 1) * skip - 1
    low, high = guidance

    def loss_fn(student, g, device):
        x0, cond, uncond = batches.batch(g)
        b = x0.shape[0]
        t = grid[torch.randint(0, len(grid), (b,), generator=g)]
        s = (t - skip).clamp_min(0)
        noise = torch.randn(x0.shape, generator=g)
        scale = low + (high - low) * torch.rand(b, generator=g)
        t, s, scale, x0, noise = (v.to(device) for v in (t, s, scale, x0, noise))
        cond, uncond = to_device(cond, device), to_device(uncond, device)
        extra = {"timestep_cond": embedding(scale - 1).to(device)} if embedding else {}
        a = a_all.to(device)
        at, as_ = a[t].view(-1, 1, 1, 1), a[s].view(-1, 1, 1, 1)
        z = at.sqrt() * x0 + (1 - at).sqrt() * noise
        c_skip, c_out = boundary_scalings(t)
        out = denoiser_output(student, {"sample": z, "timestep": t, **cond, **extra})
        pred = c_skip * z + c_out * to_eps_x0(out, z, at, kind)[1]
        with torch.no_grad():  # one solver step of the guided teacher t -> s, then the target network at s
            z_prev = solve(z, t, s, at, as_, lambda x, u, a_u: guided(teacher, x, u, cond, uncond, scale, a_u, kind))
            out_prev = denoiser_output(target, {"sample": z_prev, "timestep": s, **cond, **extra})
            c_skip_s, c_out_s = boundary_scalings(s)
            want = c_skip_s * z_prev + c_out_s * to_eps_x0(out_prev, z_prev, as_, kind)[1]
        if kind_of_loss == "l2":
            return torch.nn.functional.mse_loss(pred.float(), want.float())
        return (((pred.float() - want.float()) ** 2 + huber_c**2).sqrt() - huber_c).mean()

    return loss_fn
