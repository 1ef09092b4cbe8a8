"""The video pipelines (Wan, CogVideoX, LTX-Video, HunyuanVideo, and Wan's, LTX-Video's and CogVideoX's
image-to-video pipelines): tiny builds that save, reload and generate clips; their guidance layout as the facts predict it; and
their row of the compatibility matrix (every accelerator works under every habit or is refused at ``apply``
naming the family and why; the image-to-video rows run the accelerators that touch the call or the sampler,
as the image families' variants do)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before diffusers is imported

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from diffusers import DiffusionPipeline  # noqa: E402
from flow_matrix import JOINT_PROCESSOR, MODULE_ONLY, NO_ATTENTION_LAYER, NOT_PRUNABLE, check  # noqa: E402
from helpers import assert_plausible_images, full_only, in_fresh_memory, saved_zoo_pipelines  # noqa: E402

from fastdiff import AcceleratorError, FastPipeline  # noqa: E402
from fastdiff.core.inputs import make_inputs  # noqa: E402
from fastdiff.core.models import cfg_enabled, separate_cfg  # noqa: E402
from fastdiff.eval.compat import MATRIX_SPECS  # noqa: E402
from fastdiff.zoo.tiny_video import VIDEO_MAKERS, make_video_pipeline  # noqa: E402

MODELS = list(VIDEO_MAKERS)
BASES = ("tiny-wan", "tiny-cogvideox", "tiny-ltx", "tiny-hunyuan-video")  # the others: image-to-video
CLIP = (1, 9, 32, 32, 3)  # batch, frames, height, width, channels
_COMMON = {"deepcache": "needs a UNet", "tome": "tome does not support", "prune": NOT_PRUNABLE}
REFUSALS = {
    "tiny-wan": {**_COMMON, "fuse": NO_ATTENTION_LAYER, "attention": NO_ATTENTION_LAYER},
    "tiny-ltx": {**_COMMON, "fuse": NO_ATTENTION_LAYER, "attention": NO_ATTENTION_LAYER},
    "tiny-cogvideox": {
        **_COMMON,
        "fuse": JOINT_PROCESSOR,
        "attention": JOINT_PROCESSOR,
        "scheduler": "reshapes its noise schedule (snr_shift_scale=3.0)",
    },
    "tiny-hunyuan-video": {**_COMMON, "fuse": JOINT_PROCESSOR, "attention": JOINT_PROCESSOR},
}
REFUSALS["tiny-wan-i2v"], REFUSALS["tiny-ltx-i2v"] = REFUSALS["tiny-wan"], REFUSALS["tiny-ltx"]
REFUSALS["tiny-cogvideox-i2v"] = REFUSALS["tiny-cogvideox"]
EVERY = [a for a in MATRIX_SPECS if a != "compile"]
# module-only accelerators act on the denoiser class alone, the same under image-to-video; make test keeps the
# caches of the image-to-video rows, make test-full the rest
CELLS = [
    full_only(n, a, ci=n in BASES or a in ("blockcache", "forecast"))
    for n in MODELS
    for a in EVERY
    if n in BASES or a not in MODULE_ONLY
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saved_zoo_pipelines(tmp_path_factory, MODELS, make_video_pipeline)


def clip(pipe, seed: int = 0, **extra) -> np.ndarray:
    """A 2-step 9-frame 32px clip (``pipe``: a pipeline or a FastPipeline over one)."""
    kwargs = {
        **make_inputs(getattr(pipe, "pipe", pipe), 1),
        "num_inference_steps": 2,
        "output_type": "np",
        **extra,
    }
    return pipe(**kwargs, generator=torch.Generator().manual_seed(seed)).frames


@pytest.mark.parametrize("name", MODELS)
def test_builds_reload_and_generate_the_same_clip(name, saved):
    in_memory, directory = saved[name]
    assert json.loads((directory / "eval" / "prompts.json").read_text())["call"]["num_frames"] == 9
    reloaded = in_fresh_memory(DiffusionPipeline.from_pretrained(directory))
    reloaded.set_progress_bar_config(disable=True)
    assert type(reloaded) is type(in_memory)
    expected = clip(in_memory)
    assert_plausible_images(expected.reshape(-1, 32, 32, 3), (9, 32, 32, 3))
    assert expected.shape == CLIP and np.array_equal(clip(reloaded), expected)
    assert not np.array_equal(clip(in_memory, seed=1), expected)


def test_guidance_layout_is_known_before_the_call(saved):
    """Wan runs guidance as a second denoiser call per step, HunyuanVideo only with a negative prompt and
    true_cfg_scale > 1, CogVideoX and LTX-Video batch both branches: as the facts say before the call."""
    cases = {
        "tiny-wan": [({}, 4, 1), (dict(guidance_scale=1.0), 2, 1)],
        "tiny-hunyuan-video": [({}, 2, 1), (dict(negative_prompt="blur", true_cfg_scale=3.0), 4, 1)],
        "tiny-cogvideox": [({}, 2, 2), (dict(guidance_scale=1.0), 2, 1)],
        "tiny-ltx": [({}, 2, 2), (dict(guidance_scale=1.0), 2, 1)],
        "tiny-wan-i2v": [({}, 4, 1), (dict(guidance_scale=1.0), 2, 1)],
        "tiny-ltx-i2v": [({}, 2, 2), (dict(guidance_scale=1.0), 2, 1)],
        "tiny-cogvideox-i2v": [({}, 2, 2), (dict(guidance_scale=1.0), 2, 1)],
    }
    for name, calls in cases.items():
        fp = FastPipeline(saved[name][0])
        for extra, denoiser_calls, batch in calls:
            kwargs = {**make_inputs(fp.pipe, 1), **extra}
            batches = []
            hook = fp.denoiser.register_forward_pre_hook(
                lambda _, args, kw, seen=batches: seen.append(len((args or [kw["hidden_states"]])[0])),
                with_kwargs=True,
            )
            try:
                assert np.isfinite(fp(**kwargs, num_inference_steps=2, output_type="np").frames).all()
            finally:
                hook.remove()
            assert fp.context.denoiser_calls == denoiser_calls, (name, extra)
            assert set(batches) == {batch}, (name, extra, batches)
            assert separate_cfg(fp.pipe, kwargs) == (denoiser_calls == 4), (name, extra)
            assert cfg_enabled(fp.pipe, kwargs) == (batch == 2), (name, extra)
        fp.unwrap()


@pytest.mark.parametrize("name,accelerator", CELLS)
def test_cell(name, accelerator):
    check(name, accelerator, REFUSALS)


@pytest.mark.parametrize("name", MODELS)
def test_block_cache_modes(name, saved):
    """First-block and FORA caching, and forecast of the attention layers, run on every family; the TeaCache
    indicator needs the block's modulation facts (Wan, LTX and HunyuanVideo have them) and is refused elsewhere
    (CogVideoX), naming the block."""
    fp = FastPipeline(saved[name][0])
    base = clip(fp)
    for mode in ("first-block", "interval", "teacache"):
        try:
            handle = fp.accelerate(f"blockcache(mode={mode})")
        except AcceleratorError as error:
            assert mode == "teacache" and name.startswith("tiny-cogvideox"), str(error)
            assert "Block" in str(error), str(error)
            continue
        out = clip(fp, num_inference_steps=6)
        assert np.isfinite(out).all() and out.shape == CLIP
        handle.remove()
    plain = clip(fp, num_inference_steps=6)
    handle = fp.accelerate("forecast(order=1,interval=2,warmup=2,at=attention)")  # the blocks' attention layers
    out = clip(fp, num_inference_steps=6)
    assert np.isfinite(out).all() and not np.array_equal(out, plain)
    handle.remove()
    assert np.array_equal(clip(fp), base)
    fp.unwrap()


def test_vae_tiling_sets_the_vae_switches_and_restores_them(saved):
    """vae-tiling turns on diffusers' own switches (spatial tiles, slicing, temporal tiles where the VAE has
    them), decodes a clip long enough to take the temporal path, and remove() puts every switch back; a
    pipeline without an autoencoder refuses it."""
    from fastdiff.zoo.tiny import make_pipeline

    fp = FastPipeline(saved["tiny-ltx"][0])
    vae = fp.pipe.vae
    before = (vae.use_tiling, vae.use_slicing, vae.use_framewise_decoding, vae.use_framewise_encoding)
    assert before == (False, False, False, False)
    base = clip(fp)
    handle = fp.accelerate("vae-tiling")
    assert (vae.use_tiling, vae.use_slicing, vae.use_framewise_decoding, vae.use_framewise_encoding) == (True,) * 4
    assert np.array_equal(clip(fp), base), "a clip smaller than one tile decodes exactly as before"
    long = clip(fp, num_frames=25)  # more latent frames than one temporal tile: decoded in overlapping tiles
    assert long.shape == (1, 25, 32, 32, 3) and np.isfinite(long).all()
    handle.remove()
    assert (vae.use_tiling, vae.use_slicing, vae.use_framewise_decoding, vae.use_framewise_encoding) == before
    fp.unwrap()
    ddpm = FastPipeline(make_pipeline("tiny-ddpm"))
    with pytest.raises(AcceleratorError, match="vae-tiling.*no autoencoder"):
        ddpm.accelerate("vae-tiling")
