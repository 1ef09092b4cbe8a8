"""The wide sweep of the compatibility matrix: every registered accelerator on every family's default tiny build,
with guidance on and off (``fastdiff.eval.compat.sweep_cell``: batch 1, two steps).

A cell is refused at ``accelerate()`` with an ``AcceleratorError``, or its calls run and are finite and ``remove()``
restores the modules and the plain output; anything else fails, so an accelerator that applies and then crashes
mid-call, or crashes at apply with another error, cannot come back. The accelerators that need an artifact or a
process group are checked at apply (without one they are refused). ``make test`` runs every other accelerator on
every family but the weight changers and ``compile``, which are ``full`` rows (what they change does not depend on
guidance, and tests/test_coexist*.py and tests/core/test_video.py run them under every habit in ``make test``).
Also here: regressions of the matrix (Z-Image's per-image batch lists under cfg-interval, lowrank on pipelines that
record no default size).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import full_only, tiny_pipe

from fastdiff import FastPipeline, load_pipeline
from fastdiff.core.inputs import default_side, make_inputs
from fastdiff.core.models import PIPELINES, cfg_enabled, family_name, separate_cfg
from fastdiff.core.registry import available
from fastdiff.core.siblings import BUILD_DEFAULTS
from fastdiff.core.tensors import pixels
from fastdiff.eval.compat import MATRIX_SPECS, NEEDS_ARTIFACT, guidance_modes, matrix_spec, sweep_cell
from fastdiff.parallel.group import ParallelConfig

# every family's default tiny build (the README's table), the digits reference (class-conditional UNet) and the
# exact Gaussian-mixture models
FAMILIES = (
    "tiny-sd",
    "tiny-sdxl",
    "tiny-dit",
    "tiny-ddpm",
    "digits",
    "tiny-flux",
    "tiny-flux2",
    "tiny-sd3",
    "tiny-sana",
    "tiny-pixart-sigma",
    "tiny-qwen-image",
    "tiny-zimage",
    "tiny-wan",
    "tiny-cogvideox",
    "tiny-ltx",
    "tiny-hunyuan-video",
    "gmm",
    "gmm-flow",
)
# the pipeline classes whose facts name no family (their class names it)
UNNAMED = (
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "DiTPipeline",
    "DDPMPipeline",
    "ClassConditionalPipeline",
    "GMMPipeline",
    "GMMFlowPipeline",
)
# their transformer and scheduler classes are Flux's and Flux.2's: make test-full only
FULL_FAMILIES = ("tiny-flux-schnell", "tiny-flux2-klein")
HEAVY = ("quantize", "sparsity", "prune", "lowrank", "compile")  # weight changers and compile: full rows
MISSING = "/nonexistent/fastdiff-artifact"
ARTIFACT_SPECS = {
    "student": f"student(path={MISSING})",
    "lcm-lora": f"lcm-lora(path={MISSING})",
    "timesteps": f"timesteps(path={MISSING}.json)",
    "classifier-guidance": f"classifier-guidance(path={MISSING})",
    "tiny-vae": f"tiny-vae(path={MISSING})",
    **{f"parallel-{m}": f"parallel(mode={m})" for m in ParallelConfig.variants},
}
CELLS = [
    full_only(f, a, ci=f in FAMILIES and a not in HEAVY) for f in (*FAMILIES, *FULL_FAMILIES) for a in MATRIX_SPECS
]


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            if family.startswith("tiny-"):
                cache[family] = tiny_pipe(family)
            else:  # the shipped digits reference; the mixtures' builds (in well under a second)
                from fastdiff.zoo import build
                from fastdiff.zoo.shipped import install_digits

                out = tmp_path_factory.mktemp(family)
                cache[family] = load_pipeline(install_digits(out) if family == "digits" else build(family, out))
                cache[family].set_progress_bar_config(disable=True)
        return cache[family]

    return get


def test_sweep_covers_every_accelerator_and_family(pipes):
    assert set(MATRIX_SPECS) | {spec.split("(")[0] for spec in ARTIFACT_SPECS.values()} == set(available())
    assert set(NEEDS_ARTIFACT) == {spec.split("(")[0] for spec in ARTIFACT_SPECS.values()}
    families = {facts.family for facts in PIPELINES.values() if facts.family} | set(UNNAMED)
    assert families == {family_name(pipes(f)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_guidance_modes_turn_guidance_on_and_off(pipes, family):
    """Each guided family's ``on`` call guides and its ``off`` call does not (DDPM, Flux.2 and the mixtures have no
    ``on``)."""
    pipe = pipes(family)
    modes = guidance_modes(pipe)
    assert ("on" in modes) == (family not in ("tiny-ddpm", "tiny-flux2", "gmm", "gmm-flow"))
    for mode, kwargs in modes.items():
        assert (cfg_enabled(pipe, kwargs) or separate_cfg(pipe, kwargs)) == (mode == "on"), mode


@pytest.mark.parametrize("family,accelerator", CELLS)
def test_cell(pipes, family, accelerator):
    pipe = pipes(family)
    cell = sweep_cell(pipe, matrix_spec(accelerator, pipe), family)
    assert cell.status != "failed", cell.failures


@pytest.mark.parametrize("family", [full_only(f, ci=f in FAMILIES) for f in (*FAMILIES, *FULL_FAMILIES)])
def test_artifact_accelerators_refuse_at_apply(pipes, family):
    """Without their artifact or process group these are refused at ``accelerate()``, never a crash."""
    for spec in ARTIFACT_SPECS.values():
        cell = sweep_cell(pipes(family), spec, family)
        assert cell.status == "refused", (spec, cell.failures or cell.notes)


# -- regressions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt,batch", [("a red fox", 8), ("", 4)])
def test_cfg_interval_takes_zimage_images_whole_outside_the_window(prompt, batch):
    """Z-Image takes its batch as lists of per-image tensors. Outside the window cfg-interval took the cond images
    and then cut every tensor in them whose first dimension equalled the batch: 8 images under CFG (16 in the
    list) cut the 16 latent channels (a shape error mid-call); 4 cut the 8 tokens of the empty caption (a silently
    wrong image). With no step in the window the images are those of the unguided call."""
    pipe = tiny_pipe("tiny-zimage")
    fp = FastPipeline(pipe)

    def run(guidance):
        kwargs = dict(make_inputs(pipe, batch), prompt=[prompt] * batch, guidance_scale=guidance)
        return fp(**kwargs, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0))

    unguided = run(0.0).images
    handle = fp.accelerate("cfg-interval(start=0.0,end=0.0)")
    windowed = run(5.0).images
    np.testing.assert_allclose(windowed, unguided, atol=1e-6)
    handle.remove()
    fp.unwrap()


@pytest.mark.parametrize("family,side", [("tiny-zimage", 1024), ("tiny-cogvideox", 32)])
def test_lowrank_applies_where_the_pipeline_records_no_default_size(family, side):
    """A Z-Image or CogVideoX pipeline built from its components or loaded from a checkpoint records no default
    size (no default_sample_size, no benchmark call) and its call's height defaults to None: lowrank's input
    capture took int(None) (TypeError at apply). The facts give the side (Z-Image's own 1024, CogVideoX's
    sample_height latents), and lowrank applies, runs and restores."""
    pipe = tiny_pipe(family)
    for name in BUILD_DEFAULTS:
        pipe.__dict__.pop(name, None)
    call = dict(make_inputs(pipe, 1, side=32), height=32, width=32, num_inference_steps=2, output_type="np")
    if family == "tiny-cogvideox":
        call["num_frames"] = 9
    fp = FastPipeline(pipe)

    def run():
        return pixels(fp(**call, generator=torch.Generator().manual_seed(0)))

    plain = run()
    handle = fp.accelerate("lowrank(energy=0.9)")
    assert handle.handles[0].layers > 0 and default_side(pipe) == side
    assert np.isfinite(run()).all()
    handle.remove()
    np.testing.assert_array_equal(run(), plain)
    fp.unwrap()
