"""Full-size zoo layouts (sd15, sdxl, dit-xl-2, sd35-medium, wan-1.3b), checked on the meta device: no weights
are made.

Parameter counts are compared with the published figures (within 1%), and exactly with what diffusers builds.
"""

import inspect
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before diffusers is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from fastdiff import zoo  # noqa: E402
from fastdiff.core.models import find_denoiser  # noqa: E402
from fastdiff.zoo.full_size import (  # noqa: E402
    OUTPUT_SCALE,
    STAMP,
    build_full,
    is_built,
    make_full_pipeline,
    scale_output,
    write_pipeline,
)
from fastdiff.zoo.full_size_layouts import LAYOUTS  # noqa: E402
from fastdiff.zoo.tiny import make_tiny_sd  # noqa: E402

# Published sizes: SD 1.5 UNet 859.5M, SDXL UNet 2.567B (SDXL report), DiT-XL/2 675M (DiT paper, table 1),
# SD 3.5 medium MMDiT-X 2.24B; CLIP ViT-L/14 text 123M, OpenCLIP bigG text 694.7M, SD's KL-f8 VAE 83.7M; Wan 2.1
# "1.3B" is a rounded name: its released fp32 transformer checkpoint (5.68 GB) holds 1.419B; Wan-VAE 127M.
WAN_T, WAN_VAE = 1.419e9, 126.9e6
PUBLISHED_DENOISER = {
    "sd15": 859.5e6,
    "sdxl": 2.567e9,
    "dit-xl-2": 675e6,
    "sd35-medium": 2.24e9,
    "wan-1.3b": WAN_T,
}
CLIP_L, CLIP_G, VAE = 123.06e6, 694.66e6, 83.65e6
VAES = {"wan-1.3b": WAN_VAE}  # the others use SD's KL-f8 VAE
TEXT_ENCODERS = {
    "sd15": {"text_encoder": CLIP_L},
    "sdxl": {"text_encoder": CLIP_L, "text_encoder_2": CLIP_G},
    "dit-xl-2": {},
    "sd35-medium": {"text_encoder": CLIP_L, "text_encoder_2": CLIP_G},  # + 0.6M of projection on CLIP-L
    "wan-1.3b": {},  # umT5-XXL cut to one layer: no published size (its width is checked below)
}


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def published_count(name: str, denoiser: torch.nn.Module) -> int:
    """The denoiser's parameters as its paper counts them: diffusers' DiT repeats the timestep and class
    embedders in every block (the converted checkpoint copies them), the paper has one of each."""
    if name != "dit-xl-2":
        return count(denoiser)
    extra_copies = len(denoiser.transformer_blocks) - 1
    return count(denoiser) - extra_copies * count(denoiser.transformer_blocks[0].norm1.emb)


@pytest.fixture(scope="module")
def layouts():
    with torch.device("meta"):
        return {name: make_full_pipeline(name) for name in LAYOUTS}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_denoiser_has_the_published_size(name, layouts):
    pipe, layout = layouts[name], LAYOUTS[name]
    assert type(pipe).__name__ == layout.pipeline
    _, denoiser = find_denoiser(pipe)
    assert next(denoiser.parameters()).is_meta
    assert count(denoiser) == layout.denoiser_params
    assert published_count(name, denoiser) == pytest.approx(PUBLISHED_DENOISER[name], rel=0.01)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_text_encoders_and_vae_have_the_published_sizes(name, layouts):
    pipe = layouts[name]
    for component, expected in TEXT_ENCODERS[name].items():
        assert count(getattr(pipe, component)) == pytest.approx(expected, rel=0.01), component
    assert count(pipe.vae) == pytest.approx(VAES.get(name, VAE), rel=0.01)
    if name == "wan-1.3b":  # the transformer sees embeddings of the real encoder's width
        assert pipe.text_encoder.config.d_model == pipe.transformer.config.text_dim == 4096
    if name == "sd35-medium":
        assert pipe.text_encoder_3 is None and pipe.tokenizer_3 is None  # T5 left out, as SD3's docs allow
    tokenizer = getattr(pipe, "tokenizer", None)
    if tokenizer is not None:
        ids = tokenizer("a photo of a cat").input_ids
        assert max(ids) < pipe.text_encoder.config.vocab_size and ids[-1] == pipe.text_encoder.config.eos_token_id


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_native_image_side(name, layouts):
    pipe = layouts[name]
    _, denoiser = find_denoiser(pipe)
    if name == "wan-1.3b":  # a video transformer has no sample size; the pipeline's default height is 480
        assert inspect.signature(type(pipe).__call__).parameters["height"].default == LAYOUTS[name].side
        return
    vae_factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    assert denoiser.config.sample_size * vae_factor == LAYOUTS[name].side


def test_sizes_other_than_full_are_refused(tmp_path):
    assert {"sd15", "sdxl", "dit-xl-2", "sd35-medium", "wan-1.3b"} <= set(zoo.available())
    for name in LAYOUTS:
        assert zoo.ZOO[name][1] == ("full",)
    with pytest.raises(ValueError, match="zoo model 'sd15' has no size 'bench'; allowed: full"):
        zoo.build("sd15", tmp_path / "sd15", size="bench")
    builder, _ = zoo.ZOO["sdxl"]
    with pytest.raises(ValueError, match="sdxl is full-size only: size must be 'full', got 'test'"):
        builder(tmp_path / "sdxl", size="test", seed=0)
    with pytest.raises(ValueError, match="unknown full-size model 'sd2'; available: sd15, sdxl"):
        make_full_pipeline("sd2")
    assert not list(tmp_path.iterdir()), "a refused build must write nothing"


def test_the_command_line_takes_size_full(tmp_path, capsys):
    from fastdiff.cli.main import main

    with pytest.raises(SystemExit) as refused:  # reaches the zoo: a tiny model has no full size
        main(["zoo", "build", "tiny-sd", str(tmp_path / "t"), "--size", "full"])
    assert refused.value.code == 2
    assert "zoo model 'tiny-sd' has no size 'full'; allowed: test, bench" in capsys.readouterr().err


def test_output_layer_scaling():
    layer = torch.nn.Conv2d(4, 4, 3)
    before = [p.detach().clone() for p in layer.parameters()]
    scale_output(layer)
    for old, new in zip(before, layer.parameters()):
        torch.testing.assert_close(new, old * OUTPUT_SCALE)


def test_a_complete_build_is_not_redone(tmp_path, capsys):
    # The save path on a tiny pipeline standing in for a full one: stamp written last, then the build skipped.
    stamp = {"name": "sd15", "seed": 0, "dtype": "float16"}
    size = write_pipeline(make_tiny_sd("test"), tmp_path, stamp)
    assert (tmp_path / "model_index.json").is_file() and (tmp_path / STAMP).is_file()
    assert size > 100_000 and is_built(tmp_path, stamp)
    assert not is_built(tmp_path, {**stamp, "seed": 1})
    assert build_full("sd15", tmp_path, seed=0) == tmp_path  # would take minutes and GBs if not skipped
    assert "sd15: already built" in capsys.readouterr().out
