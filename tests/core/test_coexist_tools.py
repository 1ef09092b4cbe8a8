"""fastdiff beside other tools and habits: peft LoRA, tomesd, the DeepCache package, diffusers' own cache hooks,
accelerate offload, VAE slicing/tiling, a user's torch.compile, shared components, ControlNet residuals.

Each combination works (and is undone exactly), or is refused with an error naming the other tool: at
``accelerate()`` when the other tool came first, at the next call when it came after.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.tuners_utils import BaseTunerLayer

from fastdiff import FastPipeline
from fastdiff.core.registry import AcceleratorError
from fastdiff.eval.compat import MATRIX_SPECS, _call, module_state, state_differences
from fastdiff.zoo.tiny import make_pipeline

LORA = dict(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights=False)
WEIGHT_CHANGERS = {"quantize", "prune", "sparsity", "lowrank", "fuse"}  # declare denoiser.weights/structure


def fresh(name: str = "tiny-sd"):
    pipe = make_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("accelerator", [n for n in MATRIX_SPECS if n not in ("blockcache", "compile")])
def test_lora_changes_take_effect_or_are_refused(accelerator):
    pipe = fresh()
    fp = FastPipeline(pipe)
    fp.accelerate(MATRIX_SPECS[accelerator])
    before = _call(fp, pipe)
    pipe.unet.add_adapter(LoraConfig(**LORA), adapter_name="a")
    if accelerator in WEIGHT_CHANGERS:
        with pytest.raises(AcceleratorError, match="LoRA adapters .* were loaded"):
            _call(fp, pipe)
        fp.remove_all()  # then adapters may change, and the accelerator applies over them
        assert not np.array_equal(_call(fp, pipe), before)
        return
    loaded = _call(fp, pipe)
    assert not np.array_equal(loaded, before)
    pipe.unet.set_adapters(["a"], weights=[0.5])
    scaled = _call(fp, pipe)
    assert not np.array_equal(scaled, loaded)
    pipe.unet.disable_adapters()
    np.testing.assert_array_equal(_call(fp, pipe), before)
    pipe.unet.enable_adapters()
    pipe.unet.fuse_lora()
    np.testing.assert_allclose(_call(fp, pipe), scaled, atol=1e-4)
    pipe.unet.unfuse_lora()
    np.testing.assert_allclose(_call(fp, pipe), scaled, atol=1e-4)


def test_promptcache_keys_lora_scale_adapters_and_hooks():
    # (clip_skip is keyed by its output_hidden_states argument; diffusers 0.42's clip_skip itself fails with
    # transformers 5, whose CLIPTextModel has no .text_model, so it cannot be run here.)
    pipe = fresh()
    fp = FastPipeline(pipe)
    plain = {}
    # transformers' add_adapter wants a newer peft than exists; inject as diffusers' LoRA loader does.
    inject_adapter_in_model(LoraConfig(**{**LORA, "target_modules": ["q_proj", "v_proj"]}), pipe.text_encoder, "t")
    lora_layers = [m for m in pipe.text_encoder.modules() if isinstance(m, BaseTunerLayer)]
    cases = {
        "scale 1": dict(),
        "scale 0.3": dict(cross_attention_kwargs={"scale": 0.3}),
    }
    for name, extra in cases.items():
        plain[name] = _call(fp, pipe, **extra)
    FINAL_NORM = next(n for n, _ in pipe.text_encoder.named_modules() if n.endswith("final_layer_norm"))
    handle = fp.accelerate("promptcache")
    for _ in range(2):  # second round: hits
        for name, extra in cases.items():
            np.testing.assert_array_equal(_call(fp, pipe, **extra), plain[name], err_msg=name)
    for layer in lora_layers:
        layer.enable_adapters(False)
    off = _call(fp, pipe)
    assert not np.array_equal(off, plain["scale 1"])
    for layer in lora_layers:
        layer.enable_adapters(True)
    np.testing.assert_array_equal(_call(fp, pipe), plain["scale 1"])
    hook = pipe.text_encoder.get_submodule(FINAL_NORM).register_forward_hook(lambda m, a, out: out * 0.5)
    hooked = _call(fp, pipe)
    hook.remove()
    assert not np.array_equal(hooked, plain["scale 1"])
    np.testing.assert_array_equal(_call(fp, pipe), plain["scale 1"])
    assert handle.handles[0].stats()["hits"] > 0


def test_shared_unet_two_wrappers_each_get_their_own_hooks():
    pipe = fresh()
    img2img = fresh("tiny-sd-img2img")  # a sibling made separately, then sharing the UNet
    img2img.unet = pipe.unet
    base_t2i, base_i2i = _call(pipe, pipe), _call(img2img, img2img)
    a, b = FastPipeline(pipe), FastPipeline(img2img)
    a.accelerate("deepcache(interval=2)")
    dc_t2i = _call(a, pipe)
    np.testing.assert_array_equal(_call(b, img2img), base_i2i)  # b's calls do not see a's cache
    b.accelerate("deepcache(interval=2);tome")
    both = _call(b, img2img)
    np.testing.assert_array_equal(_call(a, pipe), dc_t2i)
    np.testing.assert_array_equal(_call(img2img, img2img), base_i2i)  # direct calls: plain
    a.unwrap()
    np.testing.assert_array_equal(_call(b, img2img), both)
    b.unwrap()
    np.testing.assert_array_equal(_call(pipe, pipe), base_t2i)
    assert "_diffusers_hook" not in pipe.unet.__dict__ and "forward" not in pipe.unet.__dict__


def test_tomesd_before_and_after():
    tomesd = pytest.importorskip("tomesd")
    pipe = fresh()
    base = _call(pipe, pipe)
    fp = FastPipeline(pipe)
    handle = fp.accelerate("tome")
    handle.remove()
    tomesd.apply_patch(pipe, ratio=0.5)  # after fastdiff's tome was removed, tomesd must act
    assert not np.array_equal(_call(pipe, pipe), base)
    with pytest.raises(AcceleratorError, match="tomesd"):
        fp.accelerate("tome")
    handle = fp.accelerate("deepcache(interval=2)")  # other accelerators compose with tomesd
    assert np.isfinite(_call(fp, pipe)).all()
    handle.remove()
    tomesd.remove_patch(pipe)
    handle = fp.accelerate("deepcache(interval=2)")
    cached = _call(fp, pipe)
    tomesd.apply_patch(pipe, ratio=0.5)  # tomesd after fastdiff: both act
    assert not np.array_equal(_call(fp, pipe), cached)
    tomesd.remove_patch(pipe)
    np.testing.assert_array_equal(_call(fp, pipe), cached)
    fp.unwrap()
    np.testing.assert_array_equal(_call(pipe, pipe), base)


def test_deepcache_package_before_and_after():
    deepcache_pkg = pytest.importorskip("DeepCache")
    pipe = fresh()
    base = _call(pipe, pipe)
    helper = deepcache_pkg.DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=2, cache_branch_id=0)
    helper.enable()
    fp = FastPipeline(pipe)
    with pytest.raises(AcceleratorError, match="DeepCache"):
        fp.accelerate("deepcache(interval=2)")
    helper.disable()
    handle = fp.accelerate("deepcache(interval=2)")
    ours = _call(fp, pipe)
    helper = deepcache_pkg.DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=2, cache_branch_id=0)
    helper.enable()  # after fastdiff: the next call is refused instead of caching twice
    with pytest.raises(AcceleratorError, match="replaced after deepcache"):
        _call(fp, pipe)
    helper.disable()
    np.testing.assert_array_equal(_call(fp, pipe), ours)
    handle.remove()
    fp.unwrap()
    np.testing.assert_array_equal(_call(pipe, pipe), base)


def test_diffusers_cache_hooks_refuse_our_caches_and_compose_with_the_rest():
    from diffusers import PyramidAttentionBroadcastConfig, apply_pyramid_attention_broadcast

    pipe = fresh()
    config = PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(100, 800),
        current_timestep_callback=lambda: 500,
    )
    apply_pyramid_attention_broadcast(pipe.unet, config)
    fp = FastPipeline(pipe)
    with pytest.raises(AcceleratorError, match="pyramid_attention_broadcast"):
        fp.accelerate("deepcache(interval=2)")
    handle = fp.accelerate("tome;cfg-interval(start=0.0,end=0.5)")
    assert np.isfinite(_call(fp, pipe)).all()
    handle.remove()


def test_diffusers_taylorseer_keeps_the_cache_context_its_user_set():
    # the wrapper's reset at the call's start must leave other tools' hook state alone (resetting every stateful
    # hook cleared the user's cache context and TaylorSeer then raised)
    from diffusers.hooks import TaylorSeerCacheConfig, apply_taylorseer_cache
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    pipe = fresh("tiny-sd3")
    config = TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=2)
    apply_taylorseer_cache(pipe.transformer, config)
    outputs = []
    for target in (pipe, FastPipeline(pipe)):  # SD3's call resets no cache state: its user does, then sets it
        pipe.transformer._diffusers_hook.reset_stateful_hooks()
        _set_cache_context(pipe.transformer, CacheContext("cond"))
        outputs.append(_call(target, pipe))
    np.testing.assert_array_equal(outputs[1], outputs[0])


def test_offload_after_fastdiff_works_before_is_refused():
    pipe = fresh()
    fp = FastPipeline(pipe)
    fp.accelerate("deepcache(interval=2)")
    cached = _call(fp, pipe)
    pipe.enable_model_cpu_offload(device="cpu")
    for _ in range(2):  # offload re-installs its hooks after every call; ours must survive that
        np.testing.assert_array_equal(_call(fp, pipe), cached)
    pipe.remove_all_hooks()
    fp.unwrap()
    other = fresh()
    other.enable_sequential_cpu_offload(device="cpu")
    with pytest.raises(AcceleratorError, match="offload"):
        FastPipeline(other).accelerate("tome")


def test_vae_slicing_and_tiling_compose():
    pipe = fresh()
    fp = FastPipeline(pipe)
    handle = fp.accelerate("deepcache(interval=2)")
    cached = _call(fp, pipe, batch=2)
    pipe.vae.enable_slicing()
    np.testing.assert_allclose(_call(fp, pipe, batch=2), cached, atol=1e-5)
    pipe.vae.enable_tiling()
    assert np.isfinite(_call(fp, pipe, batch=2)).all()
    pipe.vae.disable_tiling()
    pipe.vae.disable_slicing()
    handle.remove()


@pytest.mark.full  # 30 s of inductor compiles
def test_user_torch_compile_before_is_refused_after_works():
    pipe = fresh()
    base = _call(pipe, pipe)
    pipe.unet.compile(backend="eager")
    fp = FastPipeline(pipe)
    with pytest.raises(AcceleratorError, match="torch.compile"):
        fp.accelerate("deepcache(interval=2)")
    np.testing.assert_array_equal(_call(fp, pipe), base)
    fp.unwrap()
    pipe = fresh()
    fp = FastPipeline(pipe)
    fp.accelerate("deepcache(interval=2)")
    cached = _call(fp, pipe)
    pipe.unet.compile(backend="eager")  # compiling over fastdiff's hooks traces through them
    np.testing.assert_array_equal(_call(fp, pipe), cached)


def test_controlnet_deepcache_skips_deep_blocks_and_keeps_residuals():
    pipe = fresh("tiny-sd-controlnet")
    fp = FastPipeline(pipe)
    base = _call(fp, pipe)
    before = module_state(pipe)
    handle = fp.accelerate("deepcache(interval=2)")
    runs = []
    hook = pipe.unet.mid_block.resnets[0].register_forward_hook(lambda *_: runs.append(1))
    out = _call(fp, pipe)
    hook.remove()
    assert len(runs) == 2 and fp.context.nfe == 4  # 4 steps, the mid block ran on the 2 full ones
    assert not np.array_equal(out, base) and np.abs(out - base).mean() < 0.05
    handle.remove()
    assert not state_differences(before, module_state(pipe))
    np.testing.assert_array_equal(_call(fp, pipe), base)


def test_hooks_are_inert_outside_the_wrappers_calls():
    pipe = fresh()
    base = _call(pipe, pipe)
    fp = FastPipeline(pipe)
    fp.accelerate("deepcache(interval=2);tome;cfg-interval(start=0.0,end=0.5)")
    accelerated = _call(fp, pipe)
    for _ in range(2):
        np.testing.assert_array_equal(_call(pipe, pipe), base)
    np.testing.assert_array_equal(_call(fp, pipe), accelerated)
    with torch.no_grad():  # the UNet called by hand is plain too
        sample = torch.randn(2, 4, 16, 16)
        text = torch.randn(2, 7, pipe.unet.config.cross_attention_dim)
        hooked = pipe.unet(sample, 500, text).sample
    fp.unwrap()
    with torch.no_grad():
        torch.testing.assert_close(pipe.unet(sample, 500, text).sample, hooked, rtol=0, atol=0)


def test_progress_counts_the_steps_img2img_actually_runs():
    pipe = fresh("tiny-sd-img2img")
    fp = FastPipeline(pipe)
    seen = []
    fp.accelerate("cfg-interval(start=0.0,end=0.5)")
    # conv_in runs inside cfg-interval's hook: it sees the batch actually computed at each step
    hook = pipe.unet.conv_in.register_forward_pre_hook(lambda m, a: seen.append((fp.context.progress, len(a[0]))))
    _call(fp, pipe, steps=10, strength=0.5)  # 5 of the 10 scheduled steps run
    hook.remove()
    assert fp.context.num_steps == 5 and fp.context.step == 5
    assert seen == [(0.0, 2), (0.2, 2), (0.4, 2), (0.6, 1), (0.8, 1)]  # guided in the first half of what ran
