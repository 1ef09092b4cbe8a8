"""prune (torch-pruning channel pruning) and sparsity (weight masks) on test-size UNets."""

from __future__ import annotations

import functools
import weakref

import numpy as np
import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
from diffusers.models.embeddings import Timesteps
from helpers import call, make_fp

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.compress.prune import config_mismatch
from fastdiff.compress.sparsity import _STATES as sparsity_states
from fastdiff.compress.sparsity import make_permanent

images = functools.partial(call, steps=2)  # two seeded steps; the other keywords pass through


def digits_like_ddpm() -> FastPipeline:
    """A UNet2DModel laid out like the digits reference: 8 groups, 32-wide heads, attention below the top."""
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        block_out_channels=(32, 64, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=32,
        norm_num_groups=8,
    ).eval()
    fp = FastPipeline(DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000)))
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def test_prune_ddpm_halves_model_runs_everywhere_and_restores(tmp_path):
    fp = make_fp("tiny-ddpm")  # 32 channels in 32 groups: whole groups go
    before = images(fp)
    original = fp.denoiser.config.block_out_channels
    handle = fp.accelerate("prune(ratio=0.5)")
    info = handle.handles[0]
    assert info.params_after <= 0.5 * info.params_before
    assert info.macs_after <= 0.5 * info.macs_before
    assert info.config_exact and config_mismatch(fp.denoiser) is None
    den = fp.denoiser
    assert list(den.config.block_out_channels) == [c // 2 for c in original] and den.config.norm_num_groups == 16
    pruned = images(fp)
    assert pruned.shape == before.shape and np.isfinite(pruned).all() and not np.array_equal(pruned, before)
    with torch.no_grad():  # other batch sizes and resolutions than the captured call
        out = den(torch.randn(3, 3, 64, 64), torch.tensor([5, 50, 500])).sample
    assert out.shape == (3, 3, 64, 64)
    fp.save_pretrained(tmp_path / "pruned")
    loaded = FastPipeline.from_pretrained(tmp_path / "pruned")
    loaded.pipe.set_progress_bar_config(disable=True)
    assert sum(p.numel() for p in loaded.denoiser.parameters()) == info.params_after
    np.testing.assert_array_equal(images(loaded), pruned)
    handle.remove()
    np.testing.assert_array_equal(images(fp), before)
    assert fp.denoiser.config.block_out_channels == original


def test_prune_keeps_group_counts_removes_whole_heads_and_exact_time_projection():
    fp = digits_like_ddpm()
    den = fp.denoiser
    old_proj, old_linear = den.time_proj, den.time_embedding.linear_1.weight.detach().clone()
    handle = fp.accelerate("prune(ratio=0.5)")
    assert handle.handles[0].config_exact
    assert {m.num_groups for m in den.modules() if isinstance(m, torch.nn.GroupNorm)} == {8}
    attns = [m for m in den.modules() if type(m).__name__ == "Attention"]
    assert attns and all(a.heads == 1 and a.to_q.out_features == 32 for a in attns)  # 2 heads of 32 -> 1
    # The 16-wide sinusoidal projection is every other frequency of the 32-wide one, and linear_1 kept those.
    keep = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
    t = torch.tensor([0.0, 17.0, 999.0])
    wide = Timesteps(32, old_proj.flip_sin_to_cos, old_proj.downscale_freq_shift)(t)
    torch.testing.assert_close(den.time_proj(t), wide[:, keep], rtol=0, atol=1e-6)
    torch.testing.assert_close(den.time_embedding.linear_1.weight, old_linear[:, keep], rtol=0, atol=0)
    handle.remove()


def test_prune_sd_with_taylor_importance_and_cfg():
    fp = make_fp("tiny-sd")
    before = images(fp)
    handle = fp.accelerate("prune(ratio=0.5,importance=taylor)")
    info = handle.handles[0]
    assert info.config_exact and info.params_after < 0.5 * info.params_before
    assert all(p.grad is None for p in fp.denoiser.parameters())
    out = images(fp, height=64, width=64, guidance_scale=7.5)
    assert out.shape == (2, 64, 64, 3) and np.isfinite(out).all()
    ff = [m for n, m in fp.denoiser.named_modules() if n.endswith("ff.net.0.proj")]
    assert ff and all(m.out_features == 2 * 4 * m.in_features for m in ff)  # GEGLU halves pruned alike
    handle.remove()
    np.testing.assert_array_equal(images(fp), before)


@pytest.mark.parametrize("model", ["tiny-sd", "tiny-dit"])  # the UNet and the transformer path
def test_prune_keeps_the_original_tensors_and_training_the_pruned_model_leaves_them_exact(model):
    fp = make_fp(model)
    before = images(fp)
    originals = {n: (p, p.requires_grad) for n, p in fp.denoiser.named_parameters()}
    handle = fp.accelerate("prune(ratio=0.5,importance=taylor)")
    # pruning worked on copies sharing these tensors; afterwards the pruned model owns every tensor it holds
    ours = {p.data_ptr() for p, _ in originals.values()}
    assert not ours & {t.data_ptr() for t in (*fp.denoiser.parameters(), *fp.denoiser.buffers())}
    assert all(p.grad is None and p.requires_grad == flag for p, flag in originals.values())
    with torch.no_grad():  # what an optimizer step does to the pruned model
        for p in fp.denoiser.parameters():
            p.add_(1.0)
    handle.remove()
    assert all(p is originals[n][0] for n, p in fp.denoiser.named_parameters())
    np.testing.assert_array_equal(images(fp), before)


@pytest.mark.parametrize("model", ["tiny-sd", "tiny-sdxl", "tiny-ddpm"])
def test_tracing_one_small_sample_prunes_exactly_what_the_captured_batch_prunes(model, monkeypatch):
    import fastdiff.compress.prune as prune_module
    from fastdiff.compress.common import trace_inputs
    from fastdiff.train.inputs import capture_inputs

    fp = make_fp(model)
    captured = capture_inputs(fp, batch=2)
    small = trace_inputs(fp.denoiser, captured)
    assert small["sample"].shape[0] == 1 < captured["sample"].shape[0]
    assert small["sample"].shape[-1] == min(
        captured["sample"].shape[-1], 2 ** len(fp.denoiser.config.down_block_types)
    )
    pruned = {}
    for name, tracer in (("small", trace_inputs), ("captured", lambda den, inputs: inputs)):
        monkeypatch.setattr(prune_module, "trace_inputs", tracer)
        fp = make_fp(model)
        fp.accelerate("prune(ratio=0.5)")
        pruned[name] = fp.denoiser.state_dict()
    assert pruned["small"].keys() == pruned["captured"].keys()
    assert all(torch.equal(pruned["small"][k], pruned["captured"][k]) for k in pruned["small"])


def test_prune_refuses_bad_options():  # DiTs: tests/compress/test_prune_dit.py
    fp = make_fp("tiny-dit")
    with pytest.raises(AcceleratorError, match=r"ratio must be a number in \(0, 1\), got 1.0"):
        fp.accelerate("prune(ratio=1.0)")
    with pytest.raises(AcceleratorError, match="choose one of magnitude, taylor"):
        fp.accelerate("prune(importance=random)")
    with pytest.raises(AcceleratorError, match="2:4 zeroes exactly half; amount must be 0.5, got 0.3"):
        fp.accelerate("sparsity(pattern=2:4,amount=0.3)")


def test_weight_changers_conflict_before_anything_changes():
    fp = make_fp("tiny-ddpm")
    for specs in ("prune;sparsity", "prune;lowrank", "sparsity;lowrank"):
        with pytest.raises(AcceleratorError, match="conflicts with"):
            fp.accelerate(specs)
        assert fp.accelerators == ()


def test_structure_changers_refuse_hooked_blocks():
    from diffusers.hooks import ModelHook

    from fastdiff.core.hooks import install_hook

    fp = make_fp("tiny-ddpm")
    hook = install_hook(fp.denoiser.up_blocks[0], ModelHook(), "test.block")
    for spec in ("prune", "lowrank"):
        with pytest.raises(AcceleratorError, match=f"up_blocks.0 is hooked by test.block; apply {spec} first"):
            fp.accelerate(spec)
    hook.remove()
    fp.accelerate("prune").remove()


@pytest.mark.parametrize("pattern", ["2:4", "unstructured"])
def test_sparsity_masks_and_restores(pattern):
    fp = make_fp("tiny-sd")
    before = images(fp)
    parameters, keys = dict(fp.denoiser.named_parameters()), list(fp.denoiser.state_dict())
    amount = 0.5 if pattern == "2:4" else 0.3
    handle = fp.accelerate(f"sparsity(pattern={pattern},amount={amount})")
    info = handle.handles[0]
    assert info.layers > 10 and abs(info.sparsity - amount) < 0.01
    linear = fp.denoiser.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q
    if pattern == "2:4":
        zeros = (linear.weight.reshape(linear.weight.shape[0], -1, 4) == 0).sum(-1)
        assert (zeros >= 2).all()
    # zeroed in place: the same Parameter objects, the same state_dict keys (saving just works)
    assert all(p is parameters[k] for k, p in fp.denoiser.named_parameters())
    assert list(fp.denoiser.state_dict()) == keys
    assert not np.array_equal(images(fp), before)
    kept = [weakref.ref(z.removed) for z in sparsity_states[fp.denoiser].layers.values()]
    handle.remove()
    np.testing.assert_array_equal(images(fp), before)
    assert all(r() is None for r in kept)  # the zeroed values are freed though the handle lives on
    after = dict(fp.denoiser.named_parameters())
    assert list(after) == list(parameters) and all(after[k] is parameters[k] for k in parameters)
    assert not any(m._forward_pre_hooks for m in fp.denoiser.modules())
    assert "fastdiff.sparsity" not in fp.denoiser._diffusers_hook.hooks


def test_make_permanent_keeps_the_zeros_and_saves_plain_weights(tmp_path):
    fp = make_fp("tiny-ddpm")
    handle = fp.accelerate("sparsity(pattern=2:4)")
    masked = images(fp)
    assert make_permanent(fp.denoiser) > 0 and make_permanent(fp.denoiser) == 0
    handle.remove()  # nothing left to restore: the zeros stay
    np.testing.assert_array_equal(images(fp), masked)
    fp.save_pretrained(tmp_path / "sparse")
    loaded = FastPipeline.from_pretrained(tmp_path / "sparse")
    loaded.pipe.set_progress_bar_config(disable=True)
    np.testing.assert_array_equal(images(loaded), masked)


def test_sparsity_training_keeps_the_zeros_and_remove_brings_back_the_zeroed_values():
    fp = make_fp("tiny-ddpm")
    den = fp.denoiser
    den.requires_grad_(False)  # an inference model: the gradient masks come once training starts
    original = {n: p.detach().clone() for n, p in den.named_parameters()}
    handle = fp.accelerate("sparsity(pattern=2:4)")
    zeros = {n: p == 0 for n, p in den.named_parameters() if p.dim() > 1 and (p == 0).any()}  # the 2:4 weights
    assert len(zeros) > 10
    sample = torch.randn(2, den.config.in_channels, den.config.sample_size, den.config.sample_size)
    den.requires_grad_(True)
    optimizer = torch.optim.AdamW(den.parameters(), lr=1e-2, weight_decay=0.1)
    with torch.enable_grad():  # two training steps, as fastdiff compress's recovery takes them
        for _ in range(2):
            den(sample, torch.tensor([10, 500])).sample.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    params = dict(den.named_parameters())
    assert all((params[n][z] == 0).all() for n, z in zeros.items())  # the zeros stay zeros
    assert any(not torch.equal(params[n][~z], original[n][~z]) for n, z in zeros.items())  # the rest trained
    den.requires_grad_(False)
    handle.remove()
    # the zeroed values come back; the kept ones keep their training, as the model's own weights
    assert all(torch.equal(params[n][z], original[n][z]) for n, z in zeros.items())
