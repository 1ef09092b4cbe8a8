"""``student(path=DIR)``: put a distilled student's weights and sampler into the teacher's pipeline.

``DIR`` is a full-weight student saved by ``fastdiff distill progressive`` or ``dmd`` (``OUT/steps-N``) or
``fastdiff distill consistency`` (``OUT``). The accelerator copies the student's denoiser weights into the pipeline's
denoiser in place (the architecture must match: same config and parameter shapes), swaps in the student's
saved scheduler (DDIM v-prediction on the trailing grid, or LCM on the training grid) and defaults
``num_inference_steps`` to the student's step count (or ``steps``). ``remove()`` writes the original weights
back and restores the scheduler: outputs are bit-identical to before.

A student that baked classifier-free guidance in (distilled from a guided teacher) predicts the guided
output from the conditional input alone. On a pipeline with classifier-free guidance the accelerator then
runs only the conditional half of every batch and repeats its output for the unconditional branch (the hook
of ``cfg-interval``), so a call at any ``guidance_scale`` costs one batch per step and returns what the
student learned; no caller has to remember to pass ``guidance_scale=1``.

This lets one ``fastdiff bench`` run compare a teacher's samplers with its students, side by side::

    fastdiff bench DIGITS --config ddim50="scheduler(name=ddim,steps=50)" \\
        --config prog4="student(path=/tmp/prog/steps-4)" --guidance 2

Example::

    from fastdiff import FastPipeline

    fp = FastPipeline.from_pretrained("/tmp/digits")
    handle = fp.accelerate("student(path=/tmp/prog/steps-4)")
    images = fp(class_labels=[3, 7], output_type="np").images      # 4 steps, one batch per step
    handle.remove()                                                 # the teacher again, bit for bit
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import DirectCallError, Handle, HandleGroup, all_or_nothing, install_hook
from fastdiff.core.models import model_prediction, pipeline_facts
from fastdiff.core.options import option
from fastdiff.core.registry import Accelerator, AcceleratorError, register
from fastdiff.distill.validate import check_validated

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

HOOK_NAME = "fastdiff.student-guidance"
GUARD_NAME = "fastdiff.student-direct-call-guard"
# students that sample only on the timesteps they were trained on (progressive, and the one-step dmd / sid)
FIXED_GRID = ("progressive", "dmd", "sid")


@dataclass(frozen=True)
class DistilledAccelerator(Accelerator):
    """What ``student`` and ``lcm-lora`` share: a distilled denoiser, its sampler and step count (``steps``)."""

    path: str
    steps: int | None = option(None, ge=1)
    unvalidated: bool = False  # allow a step count the student was not measured at (fastdiff.distill.validate)

    kind = "compress"
    touches = frozenset(
        {
            "denoiser.weights",
            "denoiser.structure",
            "scheduler",
            "call.num_inference_steps",
            "denoiser.forward",
            "denoiser.batch",
        }
    )
    exclusive = frozenset({"denoiser.weights", "denoiser.structure", "scheduler"})

    def validate(self) -> None:
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps <= 0):
            raise AcceleratorError(f"{self.spec_name}: steps must be a positive integer, got {self.steps}")


@register
@dataclass(frozen=True)
class Student(DistilledAccelerator):
    """A distilled full-weight student. Example: ``fp.accelerate("student(path=/tmp/prog/steps-4)")``."""

    spec_name = "student"

    def manifest(self) -> dict:
        from fastdiff.distill.common import MANIFEST

        folder = Path(self.path).expanduser()
        manifest = folder / MANIFEST
        if (folder / "adapter_config.json").is_file():
            raise AcceleratorError(f"student: {self.path!r} is a LoRA adapter; apply it with lcm-lora(path=...)")
        if not (folder / "model_index.json").is_file() or not manifest.is_file():
            raise AcceleratorError(
                f"student: {self.path!r} is not a student saved by `fastdiff distill` "
                f"(needs model_index.json and {MANIFEST})"
            )
        info = json.loads(manifest.read_text())
        if info.get("method") not in ("progressive", "consistency", *FIXED_GRID):
            raise AcceleratorError(
                f"student: {manifest} does not describe a finished student (method "
                f"{info.get('method')!r}; a run's OUT of progressive holds steps-N students)"
            )
        return info

    def apply(self, fp: FastPipeline) -> Handle:
        from diffusers import SchedulerMixin

        info = self.manifest()
        steps = int(self.steps or info.get("sample_with", {}).get("num_inference_steps") or info.get("steps"))
        check_validated(self.spec_name, self.path, info, steps, self.unvalidated)
        folder = Path(self.path).expanduser()
        den, pipe = fp.denoiser, fp.pipe
        weights = _student_weights(den, folder / fp.denoiser_name, self.path)
        scheduler = _load_scheduler(folder / "scheduler", pipe.scheduler, SchedulerMixin, self.path)
        flows = (model_prediction(scheduler) == "flow", model_prediction(pipe.scheduler) == "flow")
        if flows[0] != flows[1]:  # v / epsilon students of a noise model are fine; a flow one is not
            raise AcceleratorError(
                f"student: the student at {self.path} predicts {model_prediction(scheduler)}, this "
                f"{type(den).__name__} {model_prediction(pipe.scheduler)}; distil one from this model"
            )
        original = {name: tensor.detach().clone() for name, tensor in den.state_dict().items()}
        original_scheduler = pipe.scheduler

        def restore():
            pipe.scheduler = original_scheduler
            with torch.no_grad():
                den.load_state_dict(original)

        with torch.no_grad():
            den.load_state_dict(weights)
        pipe.scheduler = scheduler
        with all_or_nothing([Handle(restore)]) as handles:
            try:
                handles.append(fp.set_call_default("num_inference_steps", steps))
                if info.get("method") in FIXED_GRID:  # its scheduler's timesteps are the ones it was trained on
                    trained = int(info.get("steps", steps))
                    if steps != trained:
                        raise ValueError(
                            f"the {info['method']} student at {self.path} was distilled for {trained} steps"
                        )
                    handles.append(fp.limit_steps(f"the {info['method']} student at {self.path}", only={trained}))
                handles.extend(conditional_only(fp, baked_guidance(info)))
            except ValueError as error:  # another accelerator owns that call default
                raise AcceleratorError(f"student: {error}") from error
        return HandleGroup(handles)


def conditional_only(fp, baked: float) -> list[Handle]:
    """For a student with guidance ``baked`` > 1 in it: on CFG pipelines run only the conditional branch (the
    conditional half of a batched call; a separate unconditional call returns the conditional output, uncomputed)."""
    facts = pipeline_facts(fp.pipe)
    if baked <= 1 or "cond" not in (facts.cfg_layout or facts.cfg_sequence):
        return []
    from fastdiff.guidance.interval import CFGIntervalHook

    hook = CFGIntervalHook(fp.context, 0.0, 0.0)  # an empty window: no step is guided
    handles = [install_hook(fp.denoiser, hook, HOOK_NAME, fp.context)]
    # ungated: a direct call of fp.pipe would guide the guided student again (a silently wrong image)
    handles.append(install_hook(fp.denoiser, DirectCallGuard(fp.context), GUARD_NAME + f"@{fp.context.owner}"))
    return handles


class DirectCallGuard(ModelHook):
    """Refuses denoiser calls outside the FastPipeline's calls while a baked-guidance student is applied."""

    def __init__(self, context):
        super().__init__()
        self.context = context

    def new_forward(self, module, *args, **kwargs):
        if not self.context.active:
            raise DirectCallError(
                "a student with classifier-free guidance baked in is applied to this denoiser; call the "
                "FastPipeline (fp(...)), not the diffusers pipeline directly, or remove the student first"
            )
        return self.fn_ref.original_forward(*args, **kwargs)


def baked_guidance(info: dict) -> float:
    """The classifier-free guidance scale a student's manifest says it learned (1: none, or w-embedding)."""
    if info.get("method") in FIXED_GRID:
        return float(info.get("guidance_baked_in", 1.0))
    if info.get("w_embedding"):
        return 1.0  # the student takes the scale as an input
    return float((info.get("guidance_range") or [1.0])[0])


def _student_weights(den, folder: Path, path: str) -> dict:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    config_file = folder / "config.json"
    if not files or not config_file.is_file():
        raise AcceleratorError(f"student: {path!r} has no {folder.name}/ weights in safetensors")
    config = json.loads(config_file.read_text())
    if config.get("_class_name") != type(den).__name__:
        raise AcceleratorError(
            f"student: {path!r} holds a {config.get('_class_name')}, this pipeline a {type(den).__name__}"
        )
    weights = {}
    for file in files:
        weights.update(load_file(file))
    mine = den.state_dict()
    extra, missing = sorted(set(weights) - set(mine)), sorted(set(mine) - set(weights))
    wrong = [k for k in set(weights) & set(mine) if weights[k].shape != mine[k].shape]
    if extra or missing or wrong:
        hint = " (a w-embedding student: load it with FastPipeline.from_pretrained(DIR))" if extra else ""
        raise AcceleratorError(
            f"student: {path!r} does not fit this {type(den).__name__}: extra {extra[:3]}, missing "
            f"{missing[:3]}, other shapes {sorted(wrong)[:3]}{hint}"
        )
    return weights


def _load_scheduler(folder: Path, current, base, path: str):
    import diffusers

    config_file = folder / "scheduler_config.json"
    if not config_file.is_file():
        raise AcceleratorError(f"student: {path!r} has no scheduler/scheduler_config.json")
    config = json.loads(config_file.read_text())
    cls = getattr(diffusers, config.get("_class_name", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise AcceleratorError(f"student: unknown scheduler {config.get('_class_name')!r} in {config_file}")
    scheduler = cls.from_pretrained(folder)
    if hasattr(current, "alphas_cumprod") and hasattr(scheduler, "alphas_cumprod"):
        if not torch.allclose(current.alphas_cumprod.double(), scheduler.alphas_cumprod.double(), atol=1e-6):
            raise AcceleratorError(
                f"student: {path!r} was distilled on another noise schedule than this pipeline's scheduler"
            )
    return scheduler
