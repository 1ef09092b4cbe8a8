"""Students say what they are good for: the step counts a student was measured at, and its quality there.

``validate_student`` samples a saved student (a full one as the pipeline it is saved as, an adapter on its
teacher through ``lcm-lora``) at each step count, on a report seed, and writes ``measured`` (one row per count: accuracy and
FD from the teacher's evaluator, or only that the output was finite where the model has none) and
``validated`` (the counts within ``WITHIN_POINTS`` accuracy points of the student's best) into its
``fastdiff_distill.json``. ``student(path=..., steps=N)`` and ``lcm-lora`` refuse an N outside ``validated``
unless ``unvalidated=true``; a student saved before this record existed is validated for its own default
count only.

Example::

    from fastdiff.distill.validate import validate_student

    validate_student("/tmp/lcm", "/tmp/digits", steps=(1, 2, 4, 8), images=500)
    # fp.accelerate("student(path=/tmp/lcm,steps=1)") is refused if 1 step fell short
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

WITHIN_POINTS = 5.0  # a count more than this many accuracy points below the student's best is not validated


def validated_counts(info: dict) -> list[int]:
    """The step counts a student's manifest says it was validated for (its default count, if none recorded)."""
    if "validated" in info:
        return [int(n) for n in info["validated"]]
    default = info.get("sample_with", {}).get("num_inference_steps") or info.get("steps")
    return [int(default)] if default else []


def check_validated(spec: str, path: str, info: dict, steps: int, unvalidated: bool) -> None:
    """AcceleratorError unless ``steps`` is a validated count (or ``unvalidated`` is set)."""
    from fastdiff.core.registry import AcceleratorError

    counts = validated_counts(info)
    if unvalidated or not counts or steps in counts:
        return
    measured = info.get("measured", {}).get(str(steps))
    figure = f" (measured at {steps}: {_summary(measured)})" if measured else ""
    raise AcceleratorError(
        f"{spec}: the student at {path} was validated for steps {counts}, not {steps}{figure}; pass "
        "unvalidated=true to try it anyway, or measure it with fastdiff.distill.validate.validate_student"
    )


def _summary(row: dict) -> str:
    if row.get("accuracy") is None:
        return "finite output" if row.get("finite") else "non-finite output"
    return f"{row['accuracy']:.1%} accuracy, FD {row['fd']:.2f}"


def validate_student(student_dir, teacher_dir, steps: Sequence[int], seed: int = 1, images: int = 500) -> dict:
    """Measure the student at each of ``steps`` on ``seed``; write ``measured`` and ``validated``; return them."""
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.tensors import pixels
    from fastdiff.distill.common import MANIFEST, load_student
    from fastdiff.eval import quality_for
    from fastdiff.eval.bench import make_inputs

    folder = Path(student_dir)
    manifest = folder / MANIFEST
    info = json.loads(manifest.read_text())
    adapter = (folder / "adapter_config.json").is_file()
    # a full student is a pipeline of its own (w-embedding students load only that way); an adapter goes on the teacher
    fp = FastPipeline.from_pretrained(teacher_dir) if adapter else load_student(folder)
    fp.pipe.set_progress_bar_config(disable=True)
    # the references' evaluators need their eval/ files (a random-weight model of the same class has none)
    has_eval = (Path(teacher_dir if adapter else folder) / "eval").is_dir()
    evaluator = quality_for(fp.pipe) if has_eval else None
    guidance = float(info.get("guidance_baked_in") or (info.get("guidance_range") or [1.0])[-1])
    call = dict(make_inputs(fp.pipe, images if evaluator else 2, guidance), output_type="np")
    if "guidance_scale" in call and "guidance_scale" in info.get("sample_with", {}):  # guidance baked in: call at 1
        call["guidance_scale"] = info["sample_with"]["guidance_scale"]
    measured = {}
    for n in steps:
        handle = fp.accelerate(f"lcm-lora(path={folder.resolve()},steps={n},unvalidated=true)") if adapter else None
        try:
            out = pixels(fp(**call, num_inference_steps=n, generator=torch.Generator().manual_seed(seed)))
        finally:
            if handle is not None:
                handle.remove()
        out = np.asarray(out)
        row = {
            "steps": int(n),
            "seed": seed,
            "images": int(out.shape[0]),
            "finite": bool(np.isfinite(out).all()),
        }
        if evaluator is not None:
            figures = evaluator(fp.pipe, call, out, seed)
            row.update({k: figures[k] for k in ("accuracy", "fd", "fd_floor") if k in figures})
        measured[str(n)] = row
    usable = {n: r for n, r in measured.items() if r["finite"]}
    scored = bool(usable) and all("accuracy" in r for r in usable.values())
    if scored:
        best = max(r["accuracy"] for r in usable.values())
        usable = {n: r for n, r in usable.items() if r["accuracy"] >= best - WITHIN_POINTS / 100}
    info.update(measured=measured, validated=sorted(int(n) for n in usable))
    info["validation"] = {
        "seed": seed,
        "rule": f"finite, and within {WITHIN_POINTS:g} accuracy points of the best count"
        if scored
        else "finite output (the model has no quality evaluator)",
    }
    manifest.write_text(json.dumps(info, indent=2, default=str))
    return {"measured": measured, "validated": info["validated"]}
