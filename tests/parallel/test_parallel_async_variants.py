"""parallel(mode=async) beyond text-to-image and across a user's habits: img2img, inpaint and ControlNet
pipelines; steps changing between calls; a direct call of the wrapped pipeline; a LoRA added while it is on."""

from __future__ import annotations

import functools

import helpers
import numpy as np
import pytest
import torch
from peft import LoraConfig

from fastdiff import FastPipeline
from fastdiff.eval.bench import make_inputs
from fastdiff.parallel.launch import launch
from fastdiff.parallel.run import generate
from fastdiff.zoo import build
from fastdiff.zoo.variants import make_variant

pytestmark = pytest.mark.full  # one 2-worker launch of about a minute; `make test` runs async on tiny-sd and DiT

STEPS = 6
SAMPLER = f"scheduler(name=dpm++2m,steps={STEPS})"
WARM_ONLY = f"parallel(mode=async,devices=2,warmup={STEPS})"
PIPELINED = "parallel(mode=async,devices=2,warmup=2)"
EXTRAPOLATED = "parallel(mode=async,devices=2,warmup=2,extrapolate=1)"
LORA = dict(
    r=4,
    lora_alpha=64,  # scale 16: a LoRA that changes the images plainly
    target_modules=["to_q", "to_k", "to_v", "to_out.0"],
    init_lora_weights=False,
)
VARIANTS = ("tiny-sd-img2img", "tiny-sd-inpaint", "tiny-sd-controlnet")


psnr = functools.partial(helpers.psnr, floor=1e-20)  # equal images: 200 dB, not infinity


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each variant saved as a pipeline directory (the workers load it), with its call (synthetic images)."""
    root = tmp_path_factory.mktemp("async-variants")
    base = build("tiny-sd", root / "tiny-sd", size="test")
    out = {"tiny-sd": (str(base), {"prompt": ["a red circle", "a blue square"], "guidance_scale": 5.0})}
    for name in VARIANTS:
        pipe = make_variant(name, "test")
        pipe.save_pretrained(root / name)
        call = make_inputs(pipe, batch=2, guidance=5.0)
        if "strength" in pipe.__call__.__code__.co_varnames:
            call["strength"] = 1.0  # all STEPS steps run, so the warm-up and the staged steps are alike
        out[name] = (str(root / name), call)
    return out


def hook_state(model) -> dict[str, tuple]:
    """Per module with any: its diffusers hook names and whether it has an instance ``forward``."""
    state = {}
    for name, module in model.named_modules():
        registry = getattr(module, "_diffusers_hook", None)
        hooks = tuple(registry._hook_order) if registry is not None else ()
        if hooks or "forward" in vars(module):
            state[name] = (hooks, "forward" in vars(module))
    return state


def _variants_and_habits(rank, world, runs: dict):
    variants = {
        name: generate(
            rank,
            world,
            path,
            [SAMPLER, *(f"{SAMPLER};{s}" for s in (WARM_ONLY, PIPELINED, EXTRAPOLATED))],
            call,
        )
        for name, (path, call) in runs.items()
        if name != "tiny-sd"
    }
    path, call = runs["tiny-sd"]
    fp = FastPipeline.from_pretrained(path, accelerators=SAMPLER)
    fp.pipe.set_progress_bar_config(disable=True)

    def run(steps=STEPS, target=fp):
        kwargs = dict(call, num_inference_steps=steps, output_type="np")
        return target(**kwargs, generator=torch.Generator().manual_seed(0)).images

    habits = {"plain": run(), "plain_4": run(4), "direct_plain": run(target=fp.pipe)}
    habits["hooks_before"] = hook_state(fp.pipe.unet)
    handle = fp.accelerate(PIPELINED)
    state = next(h.state for h in handle.handles if "state" in h.info)
    # the first call cuts on warm-up timings, later ones on staged timings, until the cut is kept
    while not state.settled:
        run()
    habits.update(staged=run(), staged_4=run(4), staged_again=run(), direct=run(target=fp.pipe))
    torch.manual_seed(0)  # the same LoRA on every rank, as when each loads the same file
    fp.pipe.unet.add_adapter(LoraConfig(**LORA), adapter_name="a")  # a LoRA loaded while async is on
    habits["lora_staged"] = run()
    handle.remove()
    habits["hooks_after"] = hook_state(fp.pipe.unet)
    habits["lora_plain"] = run()
    return variants, habits


@pytest.fixture(scope="module")
def results(runs):
    return launch(_variants_and_habits, 2, runs, timeout_s=90)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_img2img_inpaint_and_controlnet_run_staged_close_to_one_process(results):
    for name in VARIANTS:
        out = results[0][name]
        plain = out[SAMPLER]["images"]
        np.testing.assert_array_equal(out[f"{SAMPLER};{WARM_ONLY}"]["images"], plain, err_msg=name)
        staged = out[f"{SAMPLER};{PIPELINED}"]["images"]
        assert np.isfinite(staged).all() and 12 < psnr(staged, plain) < 200, (name, psnr(staged, plain))
        carried = out[f"{SAMPLER};{EXTRAPOLATED}"]["images"]  # stale activations carried on to the timestep
        # each arm cuts its stages on its own timings, which vary with the machine's load (measured: up to 1.1 dB
        # apart with another test beside it, 5.5 dB on ControlNet in a loaded full run: a cut moved, not a fault)
        assert np.isfinite(carried).all() and psnr(carried, plain) > psnr(staged, plain) - 8, name


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_steps_change_direct_call_and_lora_while_staged(results):
    h = results[1]
    # a second call with other steps warms up again and stays close; a third repeats the first exactly
    assert 12 < psnr(h["staged_4"], h["plain_4"]) < 200 and 12 < psnr(h["staged"], h["plain"]) < 200
    np.testing.assert_array_equal(h["staged_again"], h["staged"])
    # a direct call of the wrapped pipeline runs the whole model on each rank, untouched by the stages
    np.testing.assert_array_equal(h["direct"], h["direct_plain"])
    # the LoRA takes effect under the stages: close to the plain LoRA images, far from the images without it
    assert psnr(h["lora_plain"], h["plain"]) < 30, psnr(h["lora_plain"], h["plain"])
    assert psnr(h["lora_staged"], h["lora_plain"]) > psnr(h["lora_staged"], h["plain"]) + 3
    assert h["hooks_after"] == h["hooks_before"]  # remove() leaves every module's hooks as it found them
