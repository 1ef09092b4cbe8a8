"""Compatibility matrix of the Flux family (Flux dev/schnell, Flux.2, Flux.2 Klein, Flux img2img/inpaint/ControlNet).

Each cell works under every habit (direct calls, steps/size/batch changes, siblings, a second wrapper) and
``remove()``/``unwrap()`` restore every module, or it is refused at ``accelerate()`` with the expected reason
(tests/flow_matrix.py). Flux runs guidance as separate calls; the step context must name them cond and uncond.
"""

from __future__ import annotations

import numpy as np
import pytest
from diffusers.hooks import ModelHook
from flow_matrix import MODULE_ONLY, VARIANT_ACCELERATORS, check, pipe_of
from helpers import full_only

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.hooks import install_hook
from fastdiff.eval.compat import MATRIX_SPECS, _call

BASES = ("tiny-flux", "tiny-flux-schnell", "tiny-flux2", "tiny-flux2-klein")
VARIANTS = ("tiny-flux-img2img", "tiny-flux-inpaint", "tiny-flux-controlnet")
EVERY = [a for a in MATRIX_SPECS if a != "compile"]
# schnell and Klein share dev's and Flux.2's transformer classes: accelerators that change only modules behave
# the same there, so those two run the call-level ones (benchmarks/compat_table.py runs the whole matrix);
# `make test` runs the dev and Flux.2 rows and the inpaint variant, `make test-full` every row
FULL_ROWS = ("tiny-flux", "tiny-flux2")
CELLS = [full_only(v, a, ci=v in FULL_ROWS) for v in BASES for a in EVERY if v in FULL_ROWS or a not in MODULE_ONLY]
VARIANT_CELLS = [full_only(v, a, ci=v == "tiny-flux-inpaint") for v in VARIANTS for a in VARIANT_ACCELERATORS]


@pytest.mark.parametrize("variant,accelerator", CELLS)
def test_cell(variant, accelerator):
    check(variant, accelerator)


@pytest.mark.parametrize("variant,accelerator", VARIANT_CELLS)
def test_variant_cell(variant, accelerator):
    check(variant, accelerator)


class _Branches(ModelHook):
    def __init__(self, fp, seen):
        super().__init__()
        self.fp, self.seen = fp, seen

    def pre_forward(self, module, *args, **kwargs):
        self.seen.append((self.fp.context.step, self.fp.context.branches))
        return args, kwargs


def true_cfg(fp, **extra):
    return _call(fp, fp.pipe, steps=6, true_cfg_scale=4.0, negative_prompt=" ", **extra)


def test_true_cfg_calls_are_cond_then_uncond_and_cfg_interval_skips_the_uncond_call():
    pipe = pipe_of("tiny-flux")
    fp = FastPipeline(pipe)
    seen: list = []
    spy = install_hook(fp.denoiser, _Branches(fp, seen), "spy", fp.context)
    guided = true_cfg(fp)
    assert seen == [(s, b) for s in range(6) for b in (("cond",), ("uncond",))]
    handle = fp.accelerate("cfg-interval(start=0.0,end=0.5)")
    seen.clear()
    windowed = true_cfg(fp)
    assert seen == [(s, b) for s in range(3) for b in (("cond",), ("uncond",))] + [(s, ("cond",)) for s in (3, 4, 5)]
    assert fp.context.nfe == 9 and not np.array_equal(windowed, guided)
    # outside the window the uncond call returns the cond output: guidance s * (cond - cond) adds exactly 0
    handle.remove()
    handle = fp.accelerate("cfg-interval(start=0.0,end=0.0)")
    np.testing.assert_array_equal(true_cfg(fp), _call(fp, pipe, steps=6))
    handle.remove()
    spy.remove()
    np.testing.assert_array_equal(true_cfg(fp), guided)
    fp.unwrap()


@pytest.mark.parametrize("mode", ["first-block", "interval", "teacache"])
def test_blockcache_modes_keep_per_branch_state_under_true_cfg(mode):
    """Each mode caches cond and uncond apart: with guidance 1 (uncond == cond, same inputs) as with real CFG,
    the blocks run on the steps the mode chooses and the result stays finite and close to the uncached run."""
    pipe = pipe_of("tiny-flux")
    fp = FastPipeline(pipe)
    plain = true_cfg(fp)
    options = {"first-block": "threshold=0.3", "interval": "interval=2", "teacache": "threshold=0.5"}[mode]
    handle = fp.accelerate(f"blockcache(mode={mode},{options})")
    cached = true_cfg(fp)
    state = handle.handles[0].state
    assert state.skipped > 0 and np.isfinite(cached).all()
    assert 10 * np.log10(1 / np.mean((cached - plain) ** 2)) > 25
    handle.remove()
    np.testing.assert_array_equal(true_cfg(fp), plain)
    fp.unwrap()


@pytest.mark.parametrize("spec", ["blockcache(mode=interval,interval=2)", "quantize(mode=int8-dynamic)"])
def test_lora_on_the_transformer_takes_effect_or_is_refused(spec):
    """peft LoRA loaded on the transformer under an active accelerator: a cache sees it at the next call; a
    weight changer refuses the call (its weights no longer match); removing both leaves the plain pipeline."""
    from peft import LoraConfig

    pipe = pipe_of("tiny-flux")
    plain = _call(pipe, pipe)
    fp = FastPipeline(pipe)
    handle = fp.accelerate(spec)
    before = _call(fp, pipe)
    pipe.transformer.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False),
        adapter_name="a",
    )
    try:
        if "quantize" in spec:
            with pytest.raises(AcceleratorError, match="LoRA adapters .* were loaded"):
                _call(fp, pipe)
        else:
            assert not np.array_equal(_call(fp, pipe), before)
    finally:
        handle.remove()
        fp.unwrap()
        pipe.transformer.delete_adapters("a")
    np.testing.assert_allclose(_call(pipe, pipe), plain, atol=1e-6)
