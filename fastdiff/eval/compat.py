"""Compatibility matrix: every accelerator on every pipeline variant, under the habits users have.

``check_cell(pipe, spec)`` applies one accelerator to a pipeline and checks, call by call:

- it is applied, or refused at ``accelerate()`` with an error naming the accelerator and the pipeline, after
  which the pipeline is exactly as before;
- an accelerated call is finite; calling the diffusers pipeline directly gives either the plain pipeline's
  output or the accelerated one, bit for bit, or is refused with ``DirectCallError`` naming the fix (never
  something else);
- changing steps and image size between calls, a batch of 2, and diffusers' documented dynamic-CFG callback
  (guidance off after 40% of the steps, which halves the denoiser batch) run and are finite, and going back
  to the first call's settings reproduces it bit for bit (no state leaks across calls);
- an unwrapped sibling pipeline sharing the components gives the plain output, unless the accelerator declares
  that it changes the shared module itself (weights, structure, processors, compiled code) or refuses calls
  from outside its wrapper (``DirectCallError``); a second FastPipeline over the sibling wraps and runs;
- ``remove()`` leaves every module exactly as it was (``module_state``) and the output bit-identical.

``fastdiff compat`` and ``benchmarks/compat_table.py`` print the matrix; ``tests/core/test_coexist.py`` runs it.

``sweep_cell`` is the wide sweep's cheap check (every accelerator on every family, guidance on and off, batch 1, two
steps: tests/eval/test_compat_sweep.py): refused at ``accelerate()``, or finite calls and an exact ``remove()``.

Example::

    from fastdiff.eval.compat import check_cell
    from fastdiff.zoo.tiny import make_pipeline

    cell = check_cell(make_pipeline("tiny-sd-controlnet"), "deepcache(interval=2)")
    print(cell.status, cell.notes)  # ok ['direct call: plain output', ...]
"""

from __future__ import annotations

import copy
import inspect
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from fastdiff.core.diffusers_compat import REGISTRY_ATTRIBUTE, hook_names
from fastdiff.core.hooks import DirectCallError
from fastdiff.core.inputs import default_side, make_inputs, model_call
from fastdiff.core.models import UnsupportedModelError, cfg_enabled, pipeline_facts, separate_cfg
from fastdiff.core.pipeline import FastPipeline
from fastdiff.core.registry import AcceleratorError
from fastdiff.core.siblings import sibling
from fastdiff.core.spec import parse
from fastdiff.core.tensors import pixels

# One setting per accelerator that applies to the zoo's test-size models; a test keeps it complete.
MATRIX_SPECS = {
    "scheduler": "scheduler(name=dpm++2m)",
    "deepcache": "deepcache(interval=2)",
    "blockcache": "blockcache(mode=interval,interval=2)",
    "forecast": "forecast(interval=2,warmup=1)",
    "cfg-interval": "cfg-interval(start=0.0,end=0.5)",
    "promptcache": "promptcache",
    "tome": "tome(ratio=0.5,max_downsample=2)",
    "quantize": "quantize(mode=int8-weight)",  # the same torchao path as int8-dynamic at a third of the CPU time
    "prune": "prune(ratio=0.25)",
    "sparsity": "sparsity",
    "lowrank": "lowrank(energy=0.9)",
    "fuse": "fuse",
    "attention": "attention(backend=math)",
    "vae-tiling": "vae-tiling",
    "compile": "compile(backend=eager)",
    "experts": "experts(models=self|self,boundaries=0.5)",
}
# Flow-matching models take the flow presets (the others are refused on them: fastdiff.schedulers.presets).
FLOW_SPECS = {"scheduler": "scheduler(name=flow-unipc)"}


def matrix_spec(accelerator: str, pipe) -> str:
    """The matrix setting of ``accelerator`` for ``pipe``: flow models get the flow sampler preset."""
    from fastdiff.core.models import model_prediction

    flow = model_prediction(pipe.scheduler) == "flow"
    return (FLOW_SPECS if flow else {}).get(accelerator, MATRIX_SPECS[accelerator])


# Accelerators that need a file made for one model (a trained adapter, a tuned schedule, a trained classifier)
# or a running process group: no one setting applies to every variant in one process, so their own tests cover
# apply/remove and the refusals.
NEEDS_ARTIFACT = {
    "parallel": "a torch.distributed process group of worker processes (tests/parallel/test_parallel.py)",
    "lcm-lora": "a consistency LoRA distilled from this model (fastdiff distill consistency --lora)",
    "student": "a full-weight student distilled from this model (fastdiff distill progressive|consistency)",
    "timesteps": "timesteps tuned for this model (fastdiff tune-schedule)",
    "classifier-guidance": "a noise-aware classifier trained for this model (fastdiff train-classifier)",
    "tiny-vae": "a tiny decoder distilled from this model's VAE (fastdiff distill tiny-vae)",
}
# Declared touches that change a module itself, so pipelines sharing it see the change too.
MODULE_LEVEL = frozenset(
    {
        "denoiser.weights",
        "denoiser.structure",
        "denoiser.compiled",
        "denoiser.attn_processors",
        "denoiser.memory_format",
        "vae.decode",
    }
)
STEPS = 4


@dataclass
class Cell:
    variant: str
    spec: str
    status: str = "ok"  # "ok", "refused" (at apply time, with a clear error) or "failed"
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, condition: bool, what: str) -> None:
        if not condition:
            self.failures.append(what)
            self.status = "failed"


def module_state(pipe) -> dict:
    """Per component and submodule: ``__dict__`` keys and values, children, parameters and buffers (values)."""
    # A pipeline's own call state (_guidance_scale, _num_timesteps ...) comes and goes with calls; ours must go.
    keys = sorted(k for k in pipe.__dict__ if not k.startswith("_") or k.startswith("_fastdiff"))
    state = {"pipe": keys, "scheduler": id(pipe.scheduler)}
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            state[name] = id(component)
            continue
        for path, module in component.named_modules(remove_duplicate=False):
            entry = {}
            for key, value in module.__dict__.items():
                if key in ("_parameters", "_buffers"):
                    entry[key] = {n: None if t is None else (t.dtype, t.detach().clone()) for n, t in value.items()}
                elif key == "_modules":
                    entry[key] = {n: id(m) for n, m in value.items()}
                elif key == REGISTRY_ATTRIBUTE:  # hook names; the chained forward is rebuilt as hooks come and go
                    entry[key] = ("hooks", tuple(hook_names(value)))
                elif key == "forward" and REGISTRY_ATTRIBUTE in module.__dict__:
                    entry[key] = ("hook chain",)
                else:
                    entry[key] = _describe(value)
            state[f"{name}.{path}"] = entry
    return state


def _describe(value):
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, dict):
        return ("dict", tuple(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return (type(value).__name__, len(value))
    return ("object", id(value))


def state_differences(before: dict, after: dict) -> list[str]:
    """Where two ``module_state`` snapshots differ (empty when the pipeline is exactly as it was)."""
    out = [f"{k}: added" for k in after if k not in before] + [f"{k}: removed" for k in before if k not in after]
    for key in before.keys() & after.keys():
        a, b = before[key], after[key]
        if not isinstance(a, dict):
            if a != b:
                out.append(f"{key}: {a} -> {b}")
            continue
        for attr in sorted(a.keys() | b.keys()):
            if attr not in a or attr not in b:
                out.append(f"{key}.{attr}: {'added' if attr in b else 'removed'}")
            elif attr in ("_parameters", "_buffers"):
                if a[attr].keys() != b[attr].keys() or any(
                    (x is None) != (y is None) or (x is not None and (x[0] != y[0] or not torch.equal(x[1], y[1])))
                    for x, y in ((a[attr][n], b[attr][n]) for n in a[attr])
                ):
                    out.append(f"{key}.{attr}: values differ")
            elif a[attr] != b[attr]:
                out.append(f"{key}.{attr}: {a[attr]} -> {b[attr]}")
    return sorted(out)


def _guidance_off(pipe, step, timestep, tensors):
    # diffusers' documented dynamic classifier-free guidance: guidance off after 40% of the steps.
    if step == int(pipe.num_timesteps * 0.4):
        pipe._guidance_scale = 0.0
        return {k: v.chunk(2)[-1] for k, v in tensors.items()}
    return tensors


def _call(target, pipe, seed: int = 0, batch: int = 1, steps: int = STEPS, side: int | None = None, **extra):
    kwargs = make_inputs(pipe, batch, side=side)
    if side is not None and "height" in inspect.signature(pipe.__call__).parameters:
        kwargs.update(height=side, width=side)
    kwargs.update(extra)
    generator = torch.Generator().manual_seed(seed)
    return pixels(target(**kwargs, num_inference_steps=steps, output_type="np", generator=generator))


def _callback_args(pipe) -> dict | None:
    names = [
        n
        for n in ("prompt_embeds", "add_text_embeds", "add_time_ids")
        if n in getattr(pipe, "_callback_tensor_inputs", ())
    ]
    if "callback_on_step_end" not in inspect.signature(pipe.__call__).parameters or "prompt_embeds" not in names:
        return None
    return {"callback_on_step_end": _guidance_off, "callback_on_step_end_tensor_inputs": names}


_PLAIN_OK: dict = {}  # (pipeline class, habit) -> whether the plain diffusers pipeline supports the habit


def _plain_supports(pipe, habit: str, extra: dict) -> bool:
    key = (type(pipe).__name__, habit)
    if key not in _PLAIN_OK:
        try:
            _call(pipe, pipe, **extra)
            _PLAIN_OK[key] = True
        except Exception:  # noqa: BLE001 - the diffusers pipeline itself fails with this habit: nothing to check
            _PLAIN_OK[key] = False
    return _PLAIN_OK[key]


_BASELINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pipeline -> its plain output


def baseline(pipe) -> np.ndarray:
    """The plain pipeline's output, computed at its first use: every cell on the pipeline compares with it, so a
    cell that leaves anything behind shows in the next. (A fresh pipeline's first call installs transformers'
    lazy output-capturing hooks: module states are taken after it.)"""
    if pipe not in _BASELINES:
        _BASELINES[pipe] = _call(pipe, pipe)
    return _BASELINES[pipe]


def check_cell(pipe, spec: str, variant: str | None = None) -> Cell:
    """Apply ``spec`` to ``pipe`` (a plain diffusers pipeline) and run every habit; the pipe ends as it began."""
    cell = Cell(variant or type(pipe).__name__, spec)
    (config,) = parse(spec)
    habits = habits_of(pipe)
    # made first: before acceleration, and before the snapshots, as from_pipe may cast buffers (CogVideoX keeps a
    # float64 positional table that it casts to the transformer's dtype)
    twin = sibling(pipe)  # shares every component
    twin.set_progress_bar_config(disable=True)
    base = baseline(pipe)
    pristine = module_state(pipe)
    fp = FastPipeline(pipe)
    try:
        _run_cell(cell, fp, pipe, twin, config, habits, base)
    finally:
        fp.unwrap()
    diffs = state_differences(pristine, module_state(pipe))
    cell.check(not diffs, f"modules differ after unwrap(): {diffs[:3]}")
    return cell


def _run_cell(cell: Cell, fp: FastPipeline, pipe, twin, config, habits, base) -> None:
    before = module_state(pipe)
    try:
        handle = fp.accelerate(config)
    except (AcceleratorError, UnsupportedModelError) as error:
        cell.status, message = "refused", str(error)
        cell.notes.append(message)
        cell.check(config.spec_name in message and type(pipe).__name__ in message, f"unclear refusal: {message}")
        cell.check(not state_differences(before, module_state(pipe)), "a refusal changed the pipeline")
        cell.check(np.array_equal(_call(fp, pipe), base), "output changed after a refusal")
        return
    accelerated = _call(fp, pipe)
    cell.check(bool(np.isfinite(accelerated).all()), "accelerated output not finite")
    _direct_call(cell, pipe, base, accelerated)
    _habits(cell, fp, pipe, habits, accelerated)
    _siblings(cell, twin, config, base)
    handle.remove()
    cell.check(np.array_equal(_call(fp, pipe), base), "output after remove() differs from before")
    diffs = state_differences(before, module_state(pipe))
    cell.check(not diffs, f"modules differ after remove(): {diffs[:3]}")


def _direct_call(cell: Cell, pipe, base, accelerated) -> None:
    try:
        direct = _call(pipe, pipe)
    except DirectCallError as error:  # a clear refusal is as safe as the right image
        cell.notes.append(f"direct call: refused ({error})")
        cell.check("fp(...)" in str(error), f"the direct-call refusal does not name the fix: {error}")
        return
    if np.array_equal(direct, base):
        cell.notes.append("direct call: plain output")
        return
    cell.check(np.array_equal(direct, accelerated), "direct call gave neither the plain nor the accelerated output")
    cell.notes.append("direct call: accelerated")


def habits_of(pipe) -> list[tuple[str, dict]]:
    """The call habits a pipeline supports on its own (checked once per pipeline class, before accelerating)."""
    default = model_call(pipe).get("height") or default_side(pipe)
    side = default + 8  # SD pipelines want multiples of 8
    habits = [("steps 6", dict(steps=6)), ("batch 2", dict(batch=2))]
    if "height" in inspect.signature(pipe.__call__).parameters:
        habits.append((f"size {side}", dict(side=side)))
    callback = _callback_args(pipe)
    if callback is not None:
        habits.append(("guidance-off callback", callback))
    return [(name, extra) for name, extra in habits if _plain_supports(pipe, name, extra)]


def _habits(cell: Cell, fp: FastPipeline, pipe, habits, accelerated) -> None:
    cell.notes.append("habits: " + ", ".join(name for name, _ in habits))
    for name, extra in habits:
        try:
            out = _call(fp, pipe, **extra)
            cell.check(bool(np.isfinite(out).all()), f"{name}: output not finite")
        except Exception as error:  # noqa: BLE001 - every crash is a failed cell, reported with its habit
            cell.check(False, f"{name}: {type(error).__name__}: {error}")
    cell.check(np.array_equal(_call(fp, pipe), accelerated), "repeating the first call gave another image")


def _siblings(cell: Cell, twin, config, base) -> None:
    shared_change = bool(config.touches & MODULE_LEVEL)
    try:
        same = np.array_equal(_call(twin, twin), base)
    except DirectCallError as error:  # the shared denoiser refuses calls from outside the accelerated wrapper
        cell.notes.append(f"sibling call: refused ({error})")
        return
    cell.check(same or shared_change, "an unwrapped sibling sharing the components changed output")
    if not same:
        cell.notes.append("changes the shared module: siblings see it")
    try:
        second = FastPipeline(twin)
    except Exception as error:  # noqa: BLE001
        cell.check(False, f"wrapping a sibling failed: {type(error).__name__}: {error}")
        return
    out = _call(second, twin)
    cell.check(bool(np.isfinite(out).all()), "second wrapper output not finite")
    second.unwrap()


SWEEP_STEPS = 2  # enough for every window, interval and expert boundary of MATRIX_SPECS to switch once


def guidance_modes(pipe) -> dict[str, dict]:
    """Batch-1 call arguments with guidance ``on`` (the default scale, or 3 above where guidance stops: Flux's true
    CFG, with a negative prompt) and ``off`` (``cfg_above``), as the facts give them; ``off`` alone where none guides."""
    facts = pipeline_facts(pipe)
    on = make_inputs(pipe, 1, guidance=max(facts.default_guidance, facts.cfg_above + 3.0))
    guided = {"on": on} if cfg_enabled(pipe, on) or separate_cfg(pipe, on) else {}
    return {**guided, "off": make_inputs(pipe, 1, guidance=facts.cfg_above)}


# pipeline -> (steps, {mode: its plain output})
_SWEEP_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sweep_cell(pipe, spec: str, variant: str | None = None, steps: int = SWEEP_STEPS) -> Cell:
    """``spec`` on ``pipe`` (a plain diffusers pipeline) under each of ``guidance_modes``; the pipe ends as it began.

    ``refused``: ``accelerate()`` raised an ``AcceleratorError`` naming the spec and the pipeline. ``ok``: every call
    ran and was finite, and after ``remove()`` the modules and each mode's output are exactly the plain pipeline's.
    Any other exception (at apply, or in a call: an ``AcceleratorError`` mid-call too) or difference: ``failed``.
    """
    cell, modes = Cell(variant or type(pipe).__name__, spec), guidance_modes(pipe)

    def run(target, mode):  # fresh arguments: Z-Image's pipeline rewrites the prompt list it is given
        kwargs, generator = copy.deepcopy(modes[mode]), torch.Generator().manual_seed(0)
        return pixels(target(**kwargs, num_inference_steps=steps, output_type="np", generator=generator))

    if _SWEEP_PLAIN.get(pipe, (None,))[0] != steps:  # first: the first call installs transformers' lazy hooks
        _SWEEP_PLAIN[pipe] = (steps, {mode: run(pipe, mode) for mode in modes})
    plain, before, fp = _SWEEP_PLAIN[pipe][1], module_state(pipe), FastPipeline(pipe)
    try:
        handle = fp.accelerate(spec)
    except AcceleratorError as error:
        cell.status = "refused"
        cell.notes.append(str(error))
        named = parse(spec)[0].spec_name in str(error) and type(pipe).__name__ in str(error)
        cell.check(named, f"unclear refusal: {error}")
    except Exception as error:  # noqa: BLE001 - a crash at apply instead of a refusal fails the cell
        cell.check(False, f"accelerate() raised {type(error).__name__}, not an AcceleratorError: {error}")
    else:
        try:
            for mode in modes:
                cell.check(bool(np.isfinite(run(fp, mode)).all()), f"guidance {mode}: output not finite")
        except Exception as error:  # noqa: BLE001 - applied, then failed mid-call: what the sweep exists to catch
            cell.check(False, f"guidance {mode}: the call raised {type(error).__name__}: {error}")
        finally:
            handle.remove()
        for mode in modes:
            same = np.array_equal(run(fp, mode), plain[mode])
            cell.check(same, f"guidance {mode}: output differs after remove()")
    finally:
        fp.unwrap()
    diffs = state_differences(before, module_state(pipe))
    cell.check(not diffs, f"modules differ after remove()/unwrap(): {diffs[:3]}")
    return cell
