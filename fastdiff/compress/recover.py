"""Recovery fine-tuning of a compressed denoiser by distillation from the original, and ``compress_model``.

``recover(student, teacher, data, steps, lr, batch, out_dir, resume)`` trains the student's denoiser to
match the teacher's predictions (MSE between outputs, plus ``gt_weight`` times the usual denoising loss on
the ground truth) on noised training samples: the model's own training images when ``data`` gives them (the
digits reference: its training split), otherwise noised random samples of the right shape with the
pipeline's own conditioning (captured from a one-step call). Noise follows the pipeline's training schedule
(``DDPMScheduler.from_config`` of its scheduler). It trains with the shared loop ``fastdiff.train.loop.train``
(accelerate, a tqdm bar, an atomic checkpoint ``recover-checkpoint.pt`` every ``save_every`` steps that
``resume`` continues, a loss log ``recover-loss.csv``).

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
import os
import shutil
from pathlib import Path

import torch

from fastdiff.train.data import training_data

# Re-exported: onnx_export and the benchmarks import these from here.
from fastdiff.train.inputs import (  # noqa: F401
    as_fastpipeline,
    capture_inputs,
    denoiser_output,
    noised_inputs,
    sample_key,
    to_device,
)
from fastdiff.train.loop import train

MANIFEST = "fastdiff_compress.json"
CHECKPOINT = "recover-checkpoint.pt"
RANKS = "lowrank_ranks.json"


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
    from fastdiff.core.models import pipeline_facts

    if steps < 0 or batch <= 0 or lr <= 0:
        raise ValueError(f"recover: need steps >= 0, batch > 0, lr > 0; got {steps}, {batch}, {lr}")
    student_fp, teacher_fp = as_fastpipeline(student), as_fastpipeline(teacher)
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
    teacher_model, scheduler_config = teacher_fp.denoiser, teacher_fp.pipe.scheduler.config

    def loss_fn(net, g, device):
        x0 = labels = None
        if x0_all is not None:
            idx = torch.randint(0, x0_all.shape[0], (batch,), generator=g)
            x0 = x0_all[idx]
            if labels_all is not None:
                labels = labels_all[idx].clone()
                if null_class is not None:
                    labels[torch.rand(batch, generator=g) < null_prob] = null_class
        inputs, target = noised_inputs(scheduler_config, conditioning, x0, labels, g)
        inputs, target = to_device(inputs, device), target.to(device)
        with torch.no_grad():
            want = denoiser_output(teacher_model, inputs)
        got = denoiser_output(net, inputs)
        loss = torch.nn.functional.mse_loss(got, want)
        if gt_weight:
            loss = loss + gt_weight * torch.nn.functional.mse_loss(got[:, : target.shape[1]], target)
        return loss

    return train(
        student_fp.denoiser,
        loss_fn,
        steps,
        lr=lr,
        out_dir=out_dir,
        resume=resume,
        save_every=save_every,
        seed=seed,
        progress=progress,
        stop_after=stop_after,
        frozen=(teacher_model,),
        checkpoint=CHECKPOINT,
        log_name="recover-loss.csv",
        desc="recover",
    )


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
    from fastdiff.compress.prune import config_mismatch
    from fastdiff.compress.prune_dit import transformer_blocks, write_structure
    from fastdiff.compress.sparsity import make_permanent
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.registry import AcceleratorError
    from fastdiff.core.spec import parse

    configs = parse(specs)
    wrong = [str(c) for c in configs if c.kind != "compress"]
    if wrong or not configs:
        raise AcceleratorError(f"compress_model takes weight-changing (compress) accelerators, got {wrong or specs!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teacher = FastPipeline.from_pretrained(model_dir)
    student = FastPipeline.from_pretrained(model_dir)
    for fp in (teacher, student):
        fp.pipe.set_progress_bar_config(disable=True)
    group = student.accelerate(*configs)
    applied = {str(c): {k: v for k, v in h.info.items() if k != "ranks"} for c, h in zip(configs, group.handles)}
    den = student.denoiser
    pruned_unet = any(c.rebuilt_from_config for c in configs) and not transformer_blocks(den)
    if pruned_unet and (problem := config_mismatch(den)):
        raise AcceleratorError(
            f"{specs}: diffusers cannot rebuild the pruned UNet from its config ({problem}); try ratio=0.5"
        )
    if isinstance(data, str) and data == "auto":
        data = training_data(model_dir)
    result = recover(
        student, teacher, data, recover_steps, lr, batch, out, resume, gt_weight, seed=seed, progress=progress
    )
    make_permanent(den)
    ranks = factored_ranks(den)
    load_specs = ""
    if ranks:
        (out / RANKS).write_text(json.dumps(ranks, indent=1))
        load_specs = f"lowrank(ranks_file={RANKS})"
        merge_factors(den)
    student.pipe.save_pretrained(out, safe_serialization=True)
    structure = write_structure(student, out)  # a pruned DiT's per-block widths (else removes a stale file)
    if (Path(model_dir) / "eval").is_dir():  # the digits reference's classifier and split: bench evaluates here too
        shutil.copytree(Path(model_dir) / "eval", out / "eval", dirs_exist_ok=True)
    report = {
        "source": str(model_dir),
        "specs": ";".join(map(str, configs)),
        "load_accelerators": load_specs,
        "load_structure": structure or "",
        "applied": applied,
        "recover": result,
        "data": "training split" if data is not None else "random",
    }
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
