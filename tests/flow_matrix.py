"""The flow-matching families' part of the compatibility matrix: variants, expected refusals, the cell check.

Shared by tests/core/test_coexist_flow.py (Flux, Flux.2) and tests/core/test_coexist_flow_dit.py (SD3, Sana, PixArt-Sigma,
Qwen-Image, Z-Image). Base models run every accelerator; their img2img/inpaint/ControlNet variants run those that
touch the call or the sampler (the whole matrix: ``benchmarks/compat_table.py``).
"""

from __future__ import annotations

from fastdiff.eval.compat import check_cell, matrix_spec
from fastdiff.zoo.tiny import make_pipeline

VARIANT_ACCELERATORS = ("scheduler", "blockcache", "forecast", "cfg-interval", "promptcache", "quantize")
# accelerators that change only the modules (weights, processors, the VAE's switches): the same on every pipeline
# over one denoiser class
MODULE_ONLY = ("quantize", "sparsity", "lowrank", "fuse", "attention", "vae-tiling", "tome", "prune")
NO_ATTENTION_LAYER = "has no diffusers Attention layer"
JOINT_PROCESSOR = "only the plain processors"
NOT_PRUNABLE = "is a transformer of neither kind"
NO_NOISING = "calls the scheduler's scale_noise"

# variant -> {accelerator: a phrase of the expected refusal}; every other cell must work under every habit
REFUSALS = {
    **{
        name: {
            "tome": "tome does not support",
            "prune": NOT_PRUNABLE,
            "fuse": NO_ATTENTION_LAYER,
            "attention": NO_ATTENTION_LAYER,
        }
        for name in ("tiny-flux", "tiny-flux-schnell", "tiny-flux2", "tiny-flux2-klein")
    },
    **{
        name: {
            "tome": "tome does not support",
            "prune": NOT_PRUNABLE,
            "fuse": JOINT_PROCESSOR,
            "attention": JOINT_PROCESSOR,
        }
        for name in ("tiny-sd3", "tiny-sana", "tiny-qwen-image", "tiny-zimage")
    },
    "tiny-pixart-sigma": {"prune": "holds tensors outside its submodules"},
    "tiny-flux-img2img": {"scheduler": NO_NOISING},
    "tiny-flux-inpaint": {"scheduler": NO_NOISING},
    "tiny-sd3-img2img": {"scheduler": NO_NOISING},
    "tiny-qwen-image-img2img": {"scheduler": NO_NOISING},
    "tiny-qwen-image-inpaint": {"scheduler": NO_NOISING},
}
REFUSALS["tiny-flux2"]["cfg-interval"] = "needs a pipeline with classifier-free guidance"
REFUSALS["tiny-zimage"]["scheduler"] = "passes its own sigmas to the scheduler"
for _name in REFUSALS:
    REFUSALS[_name].setdefault("deepcache", "needs a UNet")

_PIPES: dict = {}


def pipe_of(variant: str):
    if variant not in _PIPES:
        _PIPES[variant] = make_pipeline(variant)
        _PIPES[variant].set_progress_bar_config(disable=True)
    return _PIPES[variant]


def check(variant: str, accelerator: str, refusals: dict = REFUSALS) -> None:
    pipe = pipe_of(variant)
    cell = check_cell(pipe, matrix_spec(accelerator, pipe), variant)
    assert cell.status != "failed", cell.failures
    expected = refusals.get(variant, {}).get(accelerator)
    if expected is None:
        assert cell.status == "ok", cell.notes
    else:
        assert cell.status == "refused" and expected in cell.notes[0], cell.notes
