"""tiny-vae: a tiny decoder distilled from a reference's VAE decodes the pipeline's latents, removably, and bad
input is refused before anything changes (or trains)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import AutoencoderTiny

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.models import UnsupportedModelError
from fastdiff.distill.common import DistillError
from fastdiff.distill.tiny_vae import tiny_config, tiny_vae
from fastdiff.zoo.shipped import install


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-vae")
    model = install(root / "digits-sd", "digits-sd")
    manifest = tiny_vae(model, root / "taesd", steps=30, save_every=10, progress=False)
    return model, root / "taesd", manifest


def _call(fp, output_type: str, **extra):
    prompts = ["a handwritten seven", "the digit 3"] if "prompt" not in extra else extra.pop("prompt")
    return fp(
        prompt=prompts,
        num_inference_steps=3,
        output_type=output_type,
        generator=torch.Generator().manual_seed(0),
        **extra,
    )


def assert_tiny_decode_and_restore(fp, path, **extra) -> None:
    """Under tiny-vae the images are the tiny decoder's decode of the call's latents (encoding, in img2img and
    inpainting, still uses the pipeline's VAE); ``remove()`` gives back the images of before bit for bit."""
    before = _call(fp, "pt", **extra).images
    handle = fp.accelerate(f"tiny-vae(path={path})")
    latents = _call(fp, "latent", **extra).images
    fast = _call(fp, "pt", **extra).images
    decoder = AutoencoderTiny.from_pretrained(path).decoder
    with torch.no_grad():
        expected = (decoder(latents) / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(fast, expected, rtol=0, atol=1e-5)
    assert not torch.equal(fast, before)
    handle.remove()
    assert torch.equal(_call(fp, "pt", **extra).images, before)


def test_training_lowers_the_loss_and_records_what_it_measured(trained):
    _, out, manifest = trained
    assert manifest["done"] and manifest["command"]["steps"] == 30
    assert manifest["train"]["loss_last"] < 0.5 * manifest["train"]["loss_first"]
    measured = manifest["measured"]
    assert measured["test_images"] == 360 and np.isfinite(measured["psnr_db_vs_vae_decoder"])
    assert measured["decoder_parameters"] < measured["vae_decoder_parameters"]
    assert (out / "config.json").is_file() and json.loads((out / "fastdiff_distill.json").read_text())["done"]


@pytest.mark.parametrize("kind", ["digits-sd", "digits-flow"])
def test_images_are_the_tiny_decoders_decode_of_the_latents_and_remove_restores(trained, tmp_path, kind):
    model, out, _ = trained
    # digits-flow's VAE has digits-sd's weights, with shifted latents
    path = model if kind == "digits-sd" else install(tmp_path / kind, kind)
    fp = FastPipeline.from_pretrained(path)
    fp.pipe.set_progress_bar_config(disable=True)
    assert_tiny_decode_and_restore(fp, out)


def test_bad_input_is_refused_before_anything_changes(trained, tmp_path):
    model, out, _ = trained
    fp = FastPipeline.from_pretrained(model)
    with pytest.raises(AcceleratorError, match="missing 1 required positional argument: .path."):
        fp.accelerate("tiny-vae")
    with pytest.raises(AcceleratorError, match="no config.json"):
        fp.accelerate(f"tiny-vae(path={tmp_path / 'missing'})")
    vae = fp.pipe.vae
    wrong = AutoencoderTiny(**{**tiny_config(vae, 8, 1), "latent_channels": 8})
    wrong.save_pretrained(tmp_path / "wrong")
    fits = r"does not fit this VAE.*\(8, 1, 2\) against the VAE's \(4, 1, 2\)"
    with pytest.raises(AcceleratorError, match=fits):
        fp.accelerate(f"tiny-vae(path={tmp_path / 'wrong'})")
    with pytest.raises(AcceleratorError, match="vae-tiling"):
        fp.accelerate(f"tiny-vae(path={out});vae-tiling")
    assert not fp.accelerators
    digits = FastPipeline.from_pretrained(install(tmp_path / "digits", "digits"))  # pixel space: no VAE
    with pytest.raises(UnsupportedModelError, match="autoencoder is none"):
        digits.accelerate(f"tiny-vae(path={out})")


def test_the_command_line_trains_one_and_names_the_spec_to_use(trained, tmp_path, capsys):
    from fastdiff.cli.main import main

    model, _, _ = trained
    main(["distill", "tiny-vae", str(model), str(tmp_path / "cli"), "--steps", "2", "--channels", "8"])
    assert f"tiny-vae(path={(tmp_path / 'cli').resolve()})" in capsys.readouterr().out
    assert AutoencoderTiny.from_pretrained(tmp_path / "cli").config.decoder_block_out_channels == [8, 8]


def test_trainer_refuses_bad_input_before_training(trained, tmp_path):
    model, out, _ = trained
    with pytest.raises(DistillError, match="not a diffusers pipeline directory"):
        tiny_vae(tmp_path, tmp_path / "o", steps=1, progress=False)
    with pytest.raises(DistillError, match="no AutoencoderKL"):
        tiny_vae(install(tmp_path / "digits", "digits"), tmp_path / "o", steps=1, progress=False)
    with pytest.raises(DistillError, match=r"options that differ: steps \(saved 30, now 31\)"):
        tiny_vae(model, out, steps=31, save_every=10, progress=False, resume=True)
    with pytest.raises(DistillError, match="must be >= 1"):
        tiny_vae(model, tmp_path / "o", steps=0, progress=False)
    assert not (tmp_path / "o").exists()


def _pipeline_variant(kind: str, model, tmp_path):
    """(FastPipeline, tiny decoder directory, extra call kwargs) for the other pipelines that decode with an
    AutoencoderKL: img2img, inpaint and ControlNet built from digits-sd's components, and the test-size SDXL with a
    tiny decoder of random weights (the mechanism only: its latent space has no trained tiny decoder here)."""
    import diffusers
    from diffusers import ControlNetModel

    from fastdiff.distill.tiny_vae import tiny_config
    from fastdiff.zoo.tiny import make_pipeline

    if kind == "sdxl":
        pipe = make_pipeline("tiny-sdxl", "test")
        torch.manual_seed(0)
        AutoencoderTiny(**tiny_config(pipe.vae, 8, 1)).save_pretrained(tmp_path / "sdxl-taesd")
        return pipe, tmp_path / "sdxl-taesd", {"prompt": ["a red fox"]}
    base = FastPipeline.from_pretrained(model).pipe
    side = base.unet.config.sample_size * base.vae_scale_factor
    channels = base.vae.config.in_channels  # digits-sd's images are grayscale
    image = torch.rand(2, channels, side, side, generator=torch.Generator().manual_seed(1))
    if kind == "img2img":
        return diffusers.StableDiffusionImg2ImgPipeline(**base.components), None, {"image": image, "strength": 0.7}
    if kind == "inpaint":
        mask = torch.zeros(2, 1, side, side)
        mask[..., side // 4 : side // 2, :] = 1
        pipe = diffusers.StableDiffusionInpaintPipeline(**base.components)
        return pipe, None, {"image": image, "mask_image": mask, "height": side, "width": side}
    # the conditioning embedding downsamples by the VAE's factor: one stride-2 level per factor of two
    levels = base.vae_scale_factor.bit_length()
    embedding = tuple(16 * 2**i for i in range(levels))
    controlnet = ControlNetModel.from_unet(
        base.unet, conditioning_channels=channels, conditioning_embedding_out_channels=embedding
    )
    pipe = diffusers.StableDiffusionControlNetPipeline(**base.components, controlnet=controlnet)
    return pipe, None, {"image": image, "height": side, "width": side}


@pytest.mark.parametrize("kind", ["img2img", "inpaint", "controlnet", "sdxl"])
def test_img2img_inpaint_controlnet_and_sdxl_decode_with_the_tiny_decoder(trained, tmp_path, kind):
    model, out, _ = trained
    pipe, own, extra = _pipeline_variant(kind, model, tmp_path)
    pipe.set_progress_bar_config(disable=True)
    assert_tiny_decode_and_restore(FastPipeline(pipe), own or out, **extra)
