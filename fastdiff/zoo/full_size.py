"""Full-size random-weight pipelines at the published layouts: ``sd15``, ``sdxl``, ``dit-xl-2``, ``sd35-medium``,
``wan-1.3b``.

Built offline from configs (nothing comes from a hub; tokenizers are generated as in :mod:`fastdiff.zoo.tokenizer`),
so their speed is that of the real models while their images are noise. Every denoiser's output layer is scaled
by ``OUTPUT_SCALE`` so that fp16 and bf16 runs stay finite (a random SD 1.5 UNet overflows fp16 otherwise).
SD 3.5's T5 encoder is left out, as its docs allow (``text_encoder_3=None``: zero T5 embeddings).

=============  ===========================================  =============  =====================================
model          denoiser (parameters as diffusers builds it)  native size    text encoders
=============  ===========================================  =============  =====================================
sd15           UNet2DConditionModel, 859.52M                 512 px         CLIP-L 768 x 12 (123.06M)
sdxl           UNet2DConditionModel, 2567.46M                1024 px        CLIP-L 768 + OpenCLIP-bigG 1280 x 32
dit-xl-2       DiTTransformer2DModel XL/2, 749.83M (*)       256 px         none (1000 classes)
sd35-medium    SD3Transformer2DModel MMDiT-X, 2243.17M       1024 px        CLIP-L + bigG, both projected
wan-1.3b       WanTransformer3DModel, 1419.00M               480 x 832, 81  umT5 width, one layer (the real has 24)
=============  ===========================================  =============  =====================================

(*) diffusers keeps a copy of the timestep and class embedders in each of DiT's 28 blocks; without the 27 extra
copies it is the paper's 674.83M.

The zoo registers each under the size ``full``. A build writes fp16 safetensors (sd15 2.1 GB, sdxl 6.9 GB,
dit-xl-2 1.7 GB, sd35-medium 6.3 GB) with a progress bar, prints the size on disk, and is skipped when the
directory already holds the same build. It initializes fp32 weights on the CPU (sdxl: about 14 GB of memory);
``benchmarks/gpu.py`` builds in memory on the GPU instead.

Example::

    from fastdiff.zoo.full_size import make_full_pipeline
    import torch

    with torch.device("meta"):  # the layout alone, no memory
        pipe = make_full_pipeline("sd15")
    print(sum(p.numel() for p in pipe.unet.parameters()))  # 859520964
    # on disk: fastdiff.zoo.build("sd15", "/tmp/sd15", size="full"), or python -m fastdiff.zoo.full_size sd15 DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLWan,
    DDIMScheduler,
    DiffusionPipeline,
    DiTPipeline,
    DiTTransformer2DModel,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from tqdm.auto import tqdm
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    UMT5Config,
    UMT5EncoderModel,
)

from fastdiff.zoo.full_size_layouts import (
    CLIP_G,
    CLIP_L,
    CLIP_VOCAB,
    DIT_XL_2,
    IMAGENET_FIRST,
    SD15_UNET,
    SD35_MEDIUM,
    SD_BETAS,
    SD_VAE,
    SDXL_UNET,
)
from fastdiff.zoo.registry import register_model
from fastdiff.zoo.text_encoders import make_t5_tokenizer
from fastdiff.zoo.tiny_base import in_eval_mode, seeded
from fastdiff.zoo.tiny_video import WAN_SCHEDULER
from fastdiff.zoo.tokenizer import make_clip_tokenizer

SIZES = ("full",)
OUTPUT_SCALE = 0.05  # x0.05 on the output layer kept a random SD 1.5 finite in fp16 on an H200 at 512 px
STAMP = "fastdiff_full_size.json"  # written last: a directory that has it holds a complete build


def clip_config(tokenizer: CLIPTokenizer, tower: dict) -> CLIPTextConfig:
    """A published CLIP text tower over the generated tokenizer (pooling at its end-of-text token)."""
    return CLIPTextConfig(
        vocab_size=max(CLIP_VOCAB, len(tokenizer)),
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **tower,
    )


def scale_output(layer: torch.nn.Module, scale: float = OUTPUT_SCALE) -> None:
    """Scale a denoiser's last layer so that random weights predict small, finite outputs in fp16."""
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.mul_(scale)


def on_cpu(cls, **config):
    """A scheduler: its tables live on the CPU whatever device models are being built on (meta included)."""
    with torch.device("cpu"):
        return cls(**config)


def _vae(seed: int, side: int, **extra) -> AutoencoderKL:
    return seeded(seed, AutoencoderKL, sample_size=side, **{"latent_channels": 4, **SD_VAE, **extra})


def _clip(seed: int, cls, tower: dict):
    tokenizer = make_clip_tokenizer()
    return tokenizer, seeded(seed, cls, clip_config(tokenizer, tower))


def _sd15(seed: int, step: Callable[[str], None]) -> StableDiffusionPipeline:
    tokenizer, text_encoder = _clip(seed, CLIPTextModel, CLIP_L)
    step("text encoder")
    vae = _vae(seed, 512, scaling_factor=0.18215)
    step("vae")
    unet = seeded(seed, UNet2DConditionModel, **SD15_UNET)
    scale_output(unet.conv_out)
    step("unet")
    scheduler = on_cpu(PNDMScheduler, **SD_BETAS, set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1)
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _sdxl(seed: int, step: Callable[[str], None]) -> StableDiffusionXLPipeline:
    tokenizer, text_encoder = _clip(seed, CLIPTextModel, CLIP_L)
    step("text encoder")
    tokenizer_2, text_encoder_2 = _clip(seed, CLIPTextModelWithProjection, CLIP_G)
    step("text encoder 2")
    vae = _vae(seed, 1024, scaling_factor=0.13025)
    step("vae")
    unet = seeded(seed, UNet2DConditionModel, **SDXL_UNET)
    scale_output(unet.conv_out)
    step("unet")
    scheduler = on_cpu(EulerDiscreteScheduler, **SD_BETAS, steps_offset=1, timestep_spacing="leading")
    return StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )


def _dit(seed: int, step: Callable[[str], None]) -> DiTPipeline:
    vae = _vae(seed, 256, scaling_factor=0.18215)
    step("vae")
    transformer = seeded(seed, DiTTransformer2DModel, **DIT_XL_2)
    scale_output(transformer.proj_out_2)
    step("transformer")
    scheduler = on_cpu(
        DDIMScheduler,
        num_train_timesteps=1000,
        beta_schedule="linear",
        beta_start=0.0001,
        beta_end=0.02,
        clip_sample=False,
    )
    id2label = dict(enumerate(IMAGENET_FIRST))
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler, id2label=id2label)
    pipe.register_to_config(id2label=id2label)  # saved to model_index.json, as the tiny DiT does
    return pipe


def _sd35_medium(seed: int, step: Callable[[str], None]) -> StableDiffusion3Pipeline:
    tokenizer, text_encoder = _clip(seed, CLIPTextModelWithProjection, CLIP_L)
    step("text encoder")
    tokenizer_2, text_encoder_2 = _clip(seed, CLIPTextModelWithProjection, CLIP_G)
    step("text encoder 2")
    vae = _vae(
        seed,
        1024,
        latent_channels=16,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=1.5305,
        shift_factor=0.0609,
    )
    step("vae")
    transformer = seeded(seed, SD3Transformer2DModel, **SD35_MEDIUM)
    scale_output(transformer.proj_out)
    step("transformer")
    scheduler = on_cpu(FlowMatchEulerDiscreteScheduler, num_train_timesteps=1000, shift=3.0)
    return StableDiffusion3Pipeline(
        scheduler=scheduler,
        vae=vae,
        transformer=transformer,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=None,
        tokenizer_3=None,
    )


# Wan2.1-T2V-1.3B transformer/config.json. Its text encoder, umT5-XXL (5.7B), is cut to one layer of the same
# width (4096): the transformer, what fastdiff accelerates, sees embeddings of the real shape.
WAN_1_3B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
UMT5_XXL_ONE_LAYER = dict(
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=1,
    num_heads=64,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
)


def _wan_1_3b(seed: int, step: Callable[[str], None]) -> WanPipeline:
    tokenizer = make_t5_tokenizer(model_max_length=512)
    config = UMT5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=0,
        **UMT5_XXL_ONE_LAYER,
    )
    text_encoder = seeded(seed, UMT5EncoderModel, config)
    step("text encoder")
    vae = seeded(seed, AutoencoderKLWan)  # diffusers' defaults are Wan 2.1's VAE
    step("vae")
    transformer = seeded(seed, WanTransformer3DModel, **WAN_1_3B)
    scale_output(transformer.proj_out)
    step("transformer")
    scheduler = on_cpu(UniPCMultistepScheduler, **WAN_SCHEDULER)
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )


MAKERS = {"sd15": _sd15, "sdxl": _sdxl, "dit-xl-2": _dit, "sd35-medium": _sd35_medium, "wan-1.3b": _wan_1_3b}
COMPONENT_STEPS = {"sd15": 3, "sdxl": 4, "dit-xl-2": 2, "sd35-medium": 4, "wan-1.3b": 3}


def make_full_pipeline(
    name: str, seed: int = 0, dtype: torch.dtype | None = None, progress: tqdm | None = None
) -> DiffusionPipeline:
    """Build full-size model ``name`` in memory (eval mode), on the current default device.

    ``with torch.device("meta")`` gives the layout without memory; ``with torch.device("cuda")`` initializes the
    weights on the GPU (seconds instead of minutes). ``dtype`` casts every model once built; ``progress`` is a
    bar advanced once per component.

    Example::

        with torch.device("cuda"):
            pipe = make_full_pipeline("sdxl", dtype=torch.float16)
    """
    if name not in MAKERS:
        raise ValueError(f"unknown full-size model {name!r}; available: {', '.join(MAKERS)}")

    def step(component: str) -> None:
        if progress is not None:
            progress.set_postfix_str(component)
            progress.update()

    pipe = in_eval_mode(MAKERS[name](seed, step))
    if dtype is not None:
        pipe.to(dtype)
    return pipe


def disk_size(directory: Path) -> int:
    """Bytes of every file under ``directory``."""
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())


def write_pipeline(pipe: DiffusionPipeline, out_dir: Path, stamp: dict) -> int:
    """Save ``pipe`` as safetensors, then the stamp that marks the build complete; return the size on disk."""
    out = Path(out_dir)
    (out / STAMP).unlink(missing_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    size = disk_size(out)
    (out / STAMP).write_text(json.dumps({**stamp, "bytes": size}, indent=2))
    return size


def is_built(out_dir: Path, stamp: dict) -> bool:
    """Whether ``out_dir`` already holds a complete build with these settings."""
    path = Path(out_dir) / STAMP
    if not path.is_file():
        return False
    saved = json.loads(path.read_text())
    return all(saved.get(key) == value for key, value in stamp.items())


def build_full(name: str, out_dir: str | Path, seed: int = 0, dtype: torch.dtype = torch.float16) -> Path:
    """Build ``name`` into ``out_dir`` (fp16 safetensors by default) unless it is already there.

    Example::

        build_full("dit-xl-2", "/tmp/dit-xl-2")  # prints "dit-xl-2: 1.67 GB on disk in /tmp/dit-xl-2"
    """
    if name not in MAKERS:
        raise ValueError(f"unknown full-size model {name!r}; available: {', '.join(MAKERS)}")
    out = Path(out_dir)
    stamp = {"name": name, "seed": seed, "dtype": str(dtype).removeprefix("torch.")}
    if is_built(out, stamp):
        print(f"{name}: already built in {out} ({disk_size(out) / 1e9:.2f} GB on disk)")
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(total=COMPONENT_STEPS[name] + 1, desc=f"building {name}", unit="part") as bar:
        pipe = make_full_pipeline(name, seed, dtype=dtype, progress=bar)
        bar.set_postfix_str("saving")
        size = write_pipeline(pipe, out, stamp)
        bar.update()
    print(f"{name}: {size / 1e9:.2f} GB on disk in {out}")
    return out


def _registered(name: str):
    def build(out_dir: Path, size: str = "full", seed: int = 0) -> None:
        if size not in SIZES:
            raise ValueError(f"{name} is full-size only: size must be 'full', got {size!r}")
        build_full(name, out_dir, seed)

    build.__name__ = f"build_{name.replace('-', '_')}"
    return register_model(name, SIZES)(build)


for _name in MAKERS:
    _registered(_name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="build a full-size random-weight pipeline into DIR")
    parser.add_argument("name", choices=list(MAKERS))
    parser.add_argument("dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = parser.parse_args(argv)
    build_full(args.name, args.dir, args.seed, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
