"""What the distillers share: output-directory rules, the guided teacher, saving and loading students.

The teacher and its training batches come from ``fastdiff.train.data`` (one path for every trainer).

A run writes ``OUT/fastdiff_distill.json`` before it trains (the command, teacher and settings) and marks it
done at the end; ``check_out`` refuses an OUT that exists unless it is an earlier run of the same command and
``resume`` is given. Every saved student directory gets its own ``fastdiff_distill.json`` whose
``load_accelerators`` (e.g. ``scheduler(name=ddim,steps=4)``) ``load_student`` applies.

Example::

    from fastdiff.distill.common import load_student
    fp = load_student("/tmp/prog/steps-4")   # DDIM, 4 steps by default
    images = fp(batch_size=4, output_type="np").images
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from fastdiff.train.data import TrainingInputError
from fastdiff.train.inputs import denoiser_output

MANIFEST = "fastdiff_distill.json"

DistillError = TrainingInputError  # one error for bad training input, whichever trainer is given it


def check_out(out, command: dict, resume: bool) -> None:
    """Refuse an existing non-empty OUT unless it is an earlier run of ``command`` and ``resume`` is set."""
    out = Path(out)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    manifest = out / MANIFEST
    earlier = json.loads(manifest.read_text()).get("command") if manifest.is_file() else None
    wanted = json.loads(json.dumps(command))  # as the manifest stores it (tuples become lists)
    if earlier != wanted:
        differs = sorted(k for k in set(wanted) | set(earlier or {}) if (earlier or {}).get(k) != wanted.get(k))
        detail = (
            "; options that differ: "
            + ", ".join(f"{k} (saved {(earlier or {}).get(k)!r}, now {wanted.get(k)!r})" for k in differs[:4])
            if earlier
            else ""
        )
        raise DistillError(f"{out} exists and is not an earlier run of this command{detail}; choose another OUT")
    if not resume:
        raise DistillError(f"{out} holds an earlier run of this command; pass --resume to continue it")


def start_run(out, command: dict) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps({"command": command, "done": False}, indent=2))


def finish_run(out, report: dict) -> None:
    manifest = Path(out) / MANIFEST
    data = json.loads(manifest.read_text())
    data.update(report, done=True)
    manifest.write_text(json.dumps(data, indent=2, default=str))


def parse_guidance(text: str | None) -> tuple[float, float] | None:
    """``"a,b"`` or ``"a"`` -> (a, b) guidance scales (diffusers' convention: 1 = no guidance)."""
    if text is None:
        return None
    parts = [p for p in str(text).split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 1 or values[0] > values[-1]:
        raise DistillError(f"guidance range must be 'a,b' with 1 <= a <= b, got {text!r}")
    return values[0], values[-1]


def alphas(scheduler_config) -> torch.Tensor:
    """alpha-bar of every training timestep, with alpha-bar(-1) = 1 appended last (index -1: the clean image)."""
    from diffusers import DDPMScheduler

    cumprod = DDPMScheduler.from_config(scheduler_config).alphas_cumprod.double()
    return torch.cat([cumprod, torch.ones(1, dtype=cumprod.dtype)]).float()


def to_eps_x0(out, x_t, a, kind: str):
    """(epsilon, x0) from a denoiser output of prediction type ``kind`` at alpha-bar ``a`` (shape (B,1,1,1))."""
    sa, s1 = a.sqrt(), (1 - a).sqrt()
    out = out[:, : x_t.shape[1]]  # learned-variance UNets put the variance in extra channels
    if kind == "epsilon":
        return out, (x_t - s1 * out) / sa
    if kind == "sample":
        return (x_t - sa * out) / s1.clamp_min(1e-8), out
    return sa * out + s1 * x_t, sa * x_t - s1 * out  # v_prediction


def guided(model, x_t, t, cond, uncond, scale, a, kind: str, extra=None):
    """(epsilon, x0) of ``model`` with classifier-free guidance ``scale`` (per sample; 1 = none)."""
    key = "sample"
    inputs = {key: x_t, "timestep": t, **cond, **(extra or {})}
    eps, x0 = to_eps_x0(denoiser_output(model, inputs), x_t, a, kind)
    if uncond is None or bool((scale == 1).all()):
        return eps, x0
    eps_u, x0_u = to_eps_x0(denoiser_output(model, {**inputs, **uncond}), x_t, a, kind)
    w = scale.view(-1, 1, 1, 1)
    return eps_u + w * (eps - eps_u), x0_u + w * (x0 - x0_u)


def fresh_copy(module, **config_changes):
    """A new model of the same class and config (plus ``config_changes``) with ``module``'s weights, no hooks.

    Weights missing from ``module`` (a new ``time_embedding.cond_proj`` for the w-embedding) start at zero,
    so the copy computes what ``module`` does.
    """
    copy = type(module).from_config({**module.config, **config_changes})
    missing, unexpected = copy.load_state_dict(module.state_dict(), strict=False)
    if unexpected:
        raise DistillError(f"weights {unexpected[:3]} do not fit the student's config")
    with torch.no_grad():
        for name in missing:
            copy.get_parameter(name).zero_()
    return copy.to(next(module.parameters()).device).eval()


def default_guidance(fp) -> float:
    from fastdiff.core.models import pipeline_facts

    return pipeline_facts(fp.pipe).default_guidance if pipeline_facts(fp.pipe).cfg_layout else 1.0


def save_pipeline(fp, denoiser, scheduler, out, info: dict, teacher_dir=None) -> Path:
    """Save ``fp``'s pipeline with ``denoiser`` and ``scheduler`` swapped in, atomically (temp dir, rename)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    pipe = fp.pipe
    original = {fp.denoiser_name: getattr(pipe, fp.denoiser_name), "scheduler": pipe.scheduler}
    pipe.register_modules(**{fp.denoiser_name: denoiser, "scheduler": scheduler})
    try:
        pipe.save_pretrained(tmp, safe_serialization=True)
    finally:
        pipe.register_modules(**original)
    (tmp / MANIFEST).write_text(json.dumps(info, indent=2, default=str))
    if (
        teacher_dir is not None and (Path(teacher_dir) / "eval").is_dir()
    ):  # the digits reference's classifier and split: bench scores the student
        shutil.copytree(Path(teacher_dir) / "eval", tmp / "eval", dirs_exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def load_student(path, **kwargs):
    """FastPipeline of a saved student with its recorded sampler (``load_accelerators`` of its manifest)."""
    from fastdiff.core.pipeline import FastPipeline

    manifest = Path(path) / MANIFEST
    specs = json.loads(manifest.read_text()).get("load_accelerators") if manifest.is_file() else None
    return FastPipeline.from_pretrained(path, accelerators=specs or None, **kwargs)


def trailing_grid(steps: int, train_steps: int) -> np.ndarray:
    """DDIM's ``trailing`` timesteps for ``steps`` steps (descending), as DDIMScheduler computes them."""
    return (np.round(np.arange(train_steps, 0, -train_steps / steps)) - 1).astype(np.int64)
