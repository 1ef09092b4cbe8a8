"""Recovery fine-tuning of a compressed denoiser by distillation from the original, and ``compress_model``.

``recover(student, teacher, data, steps, lr, batch, out_dir, resume)`` trains the student's denoiser to
match the teacher's predictions (MSE between outputs, plus ``gt_weight`` times the usual denoising loss on
the ground truth) on noised training samples: the model's own training images when ``data`` gives them (the
digits reference: its training split), otherwise noised random samples of the right shape with the
pipeline's own conditioning (captured from a one-step call). Noise follows the pipeline's training schedule
(``DDPMScheduler.from_config`` of its scheduler). It uses ``accelerate.Accelerator``, shows a tqdm bar, writes
an atomic checkpoint (``recover-checkpoint.pt``) every ``save_every`` steps and resumes from it.

``compress_model(model_dir, out_dir, specs, recover_steps)`` loads the pipeline, applies the weight-changing
accelerators, recovers and saves a diffusers directory: pruned UNets are saved with their new config (they load
anywhere); pruned DiTs, whose per-block heads and MLP widths no config expresses, also get
``prune_structure.json`` and load with ``load_compressed`` (``fastdiff.compress.prune_dit``); sparsity masks
are folded into the weights; low-rank splits are saved as their dense products (a standard model, same
outputs) plus ``lowrank_ranks.json``, and ``load_compressed(out_dir)`` re-splits them (SVD at the saved ranks
reproduces the factors' product). ``fastdiff_compress.json`` records what was done;
a digits reference's ``eval/`` folder (classifier, split) is copied so that ``fastdiff bench`` scores the result.

Example::

    from fastdiff.compress.recover import compress_model, load_compressed
    report = compress_model("/tmp/tiny-ddpm", "/tmp/tiny-ddpm-pruned", "prune(ratio=0.5)", recover_steps=20)
    fp = load_compressed("/tmp/tiny-ddpm-pruned")
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
from diffusers.hooks import ModelHook

MANIFEST = "fastdiff_compress.json"
CHECKPOINT = "recover-checkpoint.pt"
RANKS = "lowrank_ranks.json"


def denoiser_output(module, inputs: dict) -> torch.Tensor:
    # The class forward: training and tracing must not run the wrapper's step-counting hooks.
    return type(module).forward(module, **inputs, return_dict=False)[0]


def sample_key(inputs: dict) -> str:
    """The name of the noisy-sample argument (``sample`` for UNets, ``hidden_states`` for transformers)."""
    return next(k for k in inputs if k in ("sample", "hidden_states"))


class _Captured(Exception):
    def __init__(self, inputs: dict):
        super().__init__("captured")
        self.inputs = inputs


class _CaptureHook(ModelHook):
    """Records the named inputs of the first denoiser call and stops the pipeline there."""

    def new_forward(self, module, *args, **kwargs):
        import inspect

        bound = inspect.signature(type(module).forward).bind(module, *args, **kwargs)
        named = {k: v for k, v in bound.arguments.items() if k not in ("self", "return_dict")}
        named.update(named.pop("kwargs", {}))
        raise _Captured(_detach(named))


def _detach(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value


def capture_inputs(fp, batch: int = 2, seed: int = 0) -> dict:
    """The named inputs (sample, timestep, conditioning) of the first denoiser call of a real pipeline call."""
    from fastdiff.core.hooks import install_hook
    from fastdiff.eval.bench import make_inputs

    handle = install_hook(fp.denoiser, _CaptureHook(), "fastdiff.capture")
    bar_config = getattr(fp.pipe, "_progress_bar_config", None)
    fp.pipe.set_progress_bar_config(disable=True)
    try:
        fp(**make_inputs(fp.pipe, batch), num_inference_steps=4, output_type="np",  # img2img runs 4 x strength
           generator=torch.Generator().manual_seed(seed))  # fmt: skip
    except _Captured as captured:
        inputs = captured.inputs
    else:
        raise RuntimeError(f"{type(fp.pipe).__name__} finished without calling its denoiser")
    finally:
        handle.remove()
        if bar_config is None:
            del fp.pipe._progress_bar_config
        else:
            fp.pipe._progress_bar_config = bar_config
    if not isinstance(inputs.get("timestep"), torch.Tensor):
        inputs["timestep"] = torch.tensor(inputs["timestep"])
    return inputs


def noised_inputs(scheduler_config, inputs: dict, x0=None, labels=None, generator=None):
    """(inputs with ``sample`` = x0 noised at random training timesteps, the training target).

    ``x0`` defaults to random samples of the captured sample's shape (scale 0.5); ``labels`` replace
    ``class_labels``. The target follows the scheduler's ``prediction_type`` (epsilon, v_prediction, sample).
    """
    from diffusers import DDPMScheduler

    noise_schedule = DDPMScheduler.from_config(scheduler_config)
    key = sample_key(inputs)
    shape = inputs[key].shape
    if x0 is None:
        x0 = 0.5 * torch.randn(shape, generator=generator)
    noise = torch.randn(x0.shape, generator=generator)
    t = torch.randint(0, noise_schedule.config.num_train_timesteps, (x0.shape[0],), generator=generator)
    out = dict(inputs, timestep=t)
    out[key] = noise_schedule.add_noise(x0, noise, t)
    if labels is not None:
        out["class_labels"] = labels
    kind = noise_schedule.config.prediction_type
    target = {"epsilon": noise, "sample": x0}.get(kind)
    if target is None:
        target = noise_schedule.get_velocity(x0, noise, t)
    return out, target


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _as_fastpipeline(pipe):
    from fastdiff.core.pipeline import FastPipeline

    if isinstance(pipe, FastPipeline):
        return pipe
    wrapper = getattr(pipe, "_fastdiff_wrapper", lambda: None)()
    return wrapper if wrapper is not None else FastPipeline(pipe)


def training_data(model_dir) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(images in model space, labels) of the model's training split, or None for models without data.

    A digits reference directory keeps its split in ``eval/split.npz`` (images in [0, 1]; the model
    works in [-1, 1]).
    """
    import numpy as np

    path = Path(model_dir) / "eval" / "split.npz"
    if not path.is_file():
        return None
    with np.load(path) as split:
        images = torch.as_tensor(split["x_train"], dtype=torch.float32) * 2 - 1
        return images, torch.as_tensor(split["y_train"], dtype=torch.long)


def recover(
    student,
    teacher,
    data=None,
    steps: int = 200,
    lr: float = 5e-4,
    batch: int = 32,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    gt_weight: float = 0.0,
    save_every: int = 50,
    null_prob: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict:
    """Distill ``teacher``'s denoiser into ``student``'s (pipelines or FastPipelines); returns loss figures.

    ``data``: None (noised random samples), a (x0, labels or None) pair of tensors, or a model directory whose
    training split ``training_data`` knows. With labels and a guidance-capable pipeline, ``null_prob`` of the
    labels become the null class, as in classifier-free guidance training. ``stop_after`` ends this call after
    that many steps (checkpointed): a time-boxed run that a later call with ``resume=True`` continues.
    """
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    from fastdiff.core.models import pipeline_facts

    if steps < 0 or batch <= 0 or lr <= 0:
        raise ValueError(f"recover: need steps >= 0, batch > 0, lr > 0; got {steps}, {batch}, {lr}")
    student_fp, teacher_fp = _as_fastpipeline(student), _as_fastpipeline(teacher)
    if isinstance(data, (str, os.PathLike)):
        data = training_data(data)
    x0_all, labels_all = data if data is not None else (None, None)
    conditioning = capture_inputs(teacher_fp, batch=batch if x0_all is None else 2, seed=seed)
    null_class = None
    if labels_all is not None and pipeline_facts(teacher_fp.pipe).cfg_layout:
        null_class = teacher_fp.denoiser.config.num_class_embeds - 1
    if x0_all is not None:
        conditioning.pop("class_labels", None)
        conditioning[sample_key(conditioning)] = x0_all[:batch]

    accelerator = Accelerator()
    model, teacher_model = student_fp.denoiser, teacher_fp.denoiser.to(accelerator.device).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    cosine = lambda i: 0.5 * (1 + math.cos(math.pi * min(i / max(steps, 1), 1.0)))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    net = accelerator.unwrap_model(model)
    ckpt = Path(out_dir) / CHECKPOINT if out_dir else None
    start, losses = 0, []
    if ckpt is not None and resume and ckpt.is_file():
        state = torch.load(ckpt, map_location=accelerator.device, weights_only=False)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start, losses = state["step"], state["losses"]
    # Eval mode while training: the teacher runs in eval mode, and train-mode extras (DiT's LabelEmbedding drops
    # labels with the global RNG) would give the student other inputs than the teacher and break exact resume.
    net.eval()
    started = time.perf_counter()
    end = steps if stop_after is None else min(steps, start + stop_after)
    bar = tqdm(
        range(start, end), desc="recover", unit="step", disable=not progress, initial=start, total=steps
    )
    for step in bar:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)  # per-step seed: resume replays exactly
        x0 = labels = None
        if x0_all is not None:
            idx = torch.randint(0, x0_all.shape[0], (batch,), generator=g)
            x0 = x0_all[idx]
            if labels_all is not None:
                labels = labels_all[idx].clone()
                if null_class is not None:
                    labels[torch.rand(batch, generator=g) < null_prob] = null_class
        inputs, target = noised_inputs(teacher_fp.pipe.scheduler.config, conditioning, x0, labels, g)
        inputs, target = _to(inputs, accelerator.device), target.to(accelerator.device)
        with torch.no_grad():
            want = denoiser_output(teacher_model, inputs)
        got = denoiser_output(net, inputs)
        loss = torch.nn.functional.mse_loss(got, want)
        if gt_weight:
            loss = loss + gt_weight * torch.nn.functional.mse_loss(got[:, : target.shape[1]], target)
        accelerator.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4g}")
        done = step + 1
        if ckpt is not None and (done % save_every == 0 or done == end):
            _atomic_save(ckpt, {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                                "schedule": schedule.state_dict(), "step": done, "losses": losses})  # fmt: skip
    bar.close()
    net.eval()
    window = max(1, min(10, len(losses) // 4))
    return {
        "steps": end,
        "resumed_from": start,
        "device": str(accelerator.device),
        "seconds": time.perf_counter() - started,
        "loss_first": sum(losses[:window]) / window if losses else None,
        "loss_last": sum(losses[-window:]) / window if losses else None,
    }


def _atomic_save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # readers see the old or the new checkpoint, never half of one


def compress_model(
    model_dir,
    out_dir,
    specs: str,
    recover_steps: int = 200,
    lr: float = 5e-4,
    batch: int = 32,
    data="auto",
    gt_weight: float = 0.0,
    resume: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Load ``model_dir``, apply ``specs`` (weight-changing accelerators), recover, save to ``out_dir``.

    ``data="auto"`` uses the model's training split when it has one (``training_data``), else noised random
    samples; pass None to force those, or a (x0, labels) pair. Returns the report also written to
    ``out_dir/fastdiff_compress.json``. Load the result with ``load_compressed(out_dir)``.
    """
    from fastdiff.compress.lowrank import factored_ranks, merge_factors
    from fastdiff.compress.prune import config_mismatch, make_permanent
    from fastdiff.compress.prune_dit import transformer_blocks, write_structure
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.registry import AcceleratorError
    from fastdiff.core.spec import parse

    configs = parse(specs)
    wrong = [str(c) for c in configs if c.kind != "compress"]
    if wrong or not configs:
        raise AcceleratorError(
            f"compress_model takes weight-changing (compress) accelerators, got {wrong or specs!r}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teacher = FastPipeline.from_pretrained(model_dir)
    student = FastPipeline.from_pretrained(model_dir)
    for fp in (teacher, student):
        fp.pipe.set_progress_bar_config(disable=True)
    group = student.accelerate(*configs)
    applied = {
        str(c): {k: v for k, v in h.info.items() if k != "ranks"} for c, h in zip(configs, group.handles)
    }
    den = student.denoiser
    pruned_unet = any(c.spec_name == "prune" for c in configs) and not transformer_blocks(den)
    if pruned_unet and (problem := config_mismatch(den)):
        raise AcceleratorError(f"{specs}: diffusers cannot rebuild the pruned UNet from its config ({problem}); "
                               "try ratio=0.5")  # fmt: skip
    if isinstance(data, str) and data == "auto":
        data = training_data(model_dir)
    result = recover(student, teacher, data, recover_steps, lr, batch, out, resume, gt_weight, seed=seed,
                     progress=progress)  # fmt: skip
    make_permanent(den)
    ranks = factored_ranks(den)
    load_specs = ""
    if ranks:
        (out / RANKS).write_text(json.dumps(ranks, indent=1))
        load_specs = f"lowrank(ranks_file={RANKS})"
        merge_factors(den)
    student.pipe.save_pretrained(out, safe_serialization=True)
    structure = write_structure(student, out)  # a pruned DiT's per-block widths (else removes a stale file)
    if (
        Path(model_dir) / "eval"
    ).is_dir():  # the digits reference's classifier and split: bench evaluates here too
        shutil.copytree(Path(model_dir) / "eval", out / "eval", dirs_exist_ok=True)
    report = {"source": str(model_dir), "specs": ";".join(map(str, configs)), "load_accelerators": load_specs,
              "load_structure": structure or "", "applied": applied, "recover": result,
              "data": "training split" if data is not None else "random"}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(report, indent=2, default=str))
    (out / CHECKPOINT).unlink(missing_ok=True)
    return report


def saved_accelerators(out_dir) -> str:
    """The specs that re-create a ``compress_model`` output's speed structure ("" if none is needed).

    A pruned or sparse model loads as it is; a low-rank one is saved dense and is split again by
    ``lowrank(ranks_file=<out_dir>/lowrank_ranks.json)``.
    """
    out = Path(out_dir)
    manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
    specs = manifest.get("load_accelerators", "")
    return specs.replace(f"ranks_file={RANKS}", f"ranks_file={(out / RANKS).resolve()}")


def load_compressed(out_dir, **kwargs):
    """FastPipeline of a ``compress_model`` output with its saved factorization or pruned structure (if any)."""
    from fastdiff.compress.prune_dit import structured_components
    from fastdiff.core.pipeline import FastPipeline

    kwargs = {**structured_components(out_dir, kwargs.get("torch_dtype")), **kwargs}
    return FastPipeline.from_pretrained(out_dir, accelerators=saved_accelerators(out_dir) or None, **kwargs)
