"""The compatibility matrix: pipeline variants x every accelerator x the habits users have.

Each cell (``fastdiff.eval.compat.check_cell``) either works under every habit (finite output, direct calls
give the plain or the accelerated output exactly, no state leaking across calls with other steps, sizes and
batches or a batch-halving callback, unwrapped siblings unchanged unless the accelerator declares it changes
the shared module, a second wrapper over a sibling) and ``remove()``/``unwrap()`` restore every module exactly;
or it is refused at ``accelerate()`` with an error naming the accelerator and the pipeline. The refusals
must be exactly the expected ones, so an accelerator that stops applying somewhere fails here.
"""

from __future__ import annotations

import pytest
from helpers import full_only

from fastdiff.core.registry import available
from fastdiff.eval.compat import MATRIX_SPECS, NEEDS_ARTIFACT, check_cell
from fastdiff.zoo.tiny import make_pipeline

VARIANTS = (
    "tiny-sd",
    "tiny-sd-img2img",
    "tiny-sd-inpaint",
    "tiny-sd-controlnet",
    "tiny-sd-adapter",
    "tiny-sdxl",
    "tiny-sdxl-img2img",
    "tiny-sdxl-controlnet",
    "tiny-dit",
)
UNETS = [v for v in VARIANTS if v != "tiny-dit"]
# Expected refusals: (variant, accelerator) -> a phrase of the reason.
REFUSED = {
    **{(v, "blockcache"): "needs a transformer" for v in UNETS},
    ("tiny-dit", "deepcache"): "needs a UNet",
    ("tiny-dit", "promptcache"): "needs a text encoder",
    **{
        (v, "prune"): "ControlNet / T2I-Adapter"
        for v in ("tiny-sd-controlnet", "tiny-sd-adapter", "tiny-sdxl-controlnet")
    },
}
FAST = [name for name in MATRIX_SPECS if name != "compile"]  # compile traces for ~10 s a variant: slow test
BASES = ("tiny-sd", "tiny-sdxl", "tiny-dit")
# Accelerators that change only modules (weights, processors) behave the same under every call shape, so the
# img2img/inpaint/ControlNet/adapter variants run the others (as in tests/flow_matrix.py); the whole matrix is
# benchmarks/compat_table.py.
MODULE_ONLY = ("quantize", "sparsity", "lowrank", "fuse", "attention", "vae-tiling")
# `make test` runs the base rows and the ControlNet row; `make test-full` every variant
CI_ROWS = (*BASES, "tiny-sd-controlnet")
CELLS = [full_only(v, a, ci=v in CI_ROWS) for v in VARIANTS for a in FAST if v in BASES or a not in MODULE_ONLY]


def test_matrix_covers_every_accelerator():
    assert set(MATRIX_SPECS) | set(NEEDS_ARTIFACT) == set(available())
    assert not set(MATRIX_SPECS) & set(NEEDS_ARTIFACT)


@pytest.mark.parametrize(("variant", "accelerator"), CELLS)
def test_cell(pipes, variant, accelerator):
    cell = check_cell(pipes(variant), MATRIX_SPECS[accelerator], variant)
    assert cell.status != "failed", cell.failures
    expected = REFUSED.get((variant, accelerator))
    if expected is None:
        assert cell.status == "ok", cell.notes
    else:
        assert cell.status == "refused" and expected in cell.notes[0], cell.notes


@pytest.mark.full
@pytest.mark.parametrize("variant", ("tiny-sd", "tiny-dit"))
def test_compile_cell(pipes, variant):
    cell = check_cell(pipes(variant), MATRIX_SPECS["compile"], variant)
    assert cell.status == "ok", cell.failures or cell.notes


def test_fresh_pipelines_keep_their_baseline():
    """A fresh pipeline's first call installs transformers' lazy output-capturing hooks (SDXL's text encoders):
    the cell's baseline is taken after it, so a cell on a never-called pipeline does not report them."""
    for _ in range(2):  # the second finds its habits cached and its pipeline never called
        pipe = make_pipeline("tiny-sdxl")
        pipe.set_progress_bar_config(disable=True)
        cell = check_cell(pipe, MATRIX_SPECS["deepcache"], "tiny-sdxl")
        assert cell.status == "ok", cell.failures


@pytest.mark.parametrize("method", ["student", "lcm-lora"])
def test_baked_guidance_students_refuse_direct_calls(tmp_path, method):
    """A student with guidance baked in makes a direct call of the wrapped pipe raise (it would be guided twice);
    the cell accepts that refusal and every other habit still holds."""
    from fastdiff.distill.consistency import consistency
    from fastdiff.zoo import build

    teacher = build("tiny-sd", tmp_path / "teacher", size="test")
    lora = 2 if method == "lcm-lora" else None
    consistency(
        teacher, tmp_path / "student", guidance_range="2", lora=lora, train_steps=2, batch=2, skip=100, progress=False
    )
    pipe = make_pipeline("tiny-sd-img2img")
    pipe.set_progress_bar_config(disable=True)
    cell = check_cell(pipe, f"{method}(path={tmp_path / 'student'},steps=4)", "tiny-sd-img2img")
    assert cell.status == "ok", cell.failures
    assert any(note.startswith("direct call: refused") for note in cell.notes), cell.notes
