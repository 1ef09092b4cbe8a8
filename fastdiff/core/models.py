"""Per-pipeline facts: how each pipeline feeds its denoiser, its guidance layout and what it predicts (the
denoisers' own facts, where their blocks are, live beside it in ``fastdiff.core.denoisers``).

Accelerators look facts up here; a model with no entry fails loudly at ``apply`` (``UnsupportedModelError``).

Example::

    from fastdiff.core.models import pipeline_facts
    facts = pipeline_facts(pipe)          # PipelineFacts(inputs="prompt", cfg_layout=("uncond", "cond"), ...)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fastdiff.core.registry import AcceleratorError


class UnsupportedModelError(AcceleratorError):
    """The accelerator has no facts for this model, or the model cannot take it (an ``AcceleratorError``)."""


@dataclass(frozen=True)
class PipelineFacts:
    inputs: str  # how a benchmark batch is given: "prompt", "class_labels" or "batch_size"
    cfg_layout: tuple[str, ...] = ()  # branch order when guidance batches both branches; () = no CFG
    default_guidance: float = 1.0  # the pipeline's own default guidance_scale
    default_batch: int = 1  # batch a benchmark uses unless told
    num_classes: int = 0  # labels a benchmark cycles through (class-conditional models)
    image_inputs: tuple[str, ...] = ()  # call arguments that take images (init image, mask, control image)
    prompt_embeds: tuple[str, ...] = ()  # call arguments taking encode_prompt's outputs (stage pipelining)
    # branch of each denoiser call within one step when guidance runs the branches as separate calls (Flux's
    # and Qwen-Image's true CFG); the first call of a step is cond, a second one uncond
    cfg_sequence: tuple[str, ...] = ()
    guidance_arg: str = "guidance_scale"  # the call argument that turns classifier-free guidance on
    # passes its own sigmas to set_timesteps (schedulers that take none fail): "always", "list" (always, as a
    # Python list: Z-Image), or "unless-flow-sigmas" (Flux, Flux.2: not to a solver with use_flow_sigmas); "" = never
    passes_sigmas: str = ""
    passes_mu: bool = False  # passes a dynamic-shift mu to set_timesteps, dynamic shifting or not
    scheduler_methods: tuple[str, ...] = ()  # scheduler methods it calls beyond set_timesteps/step (img2img)
    family: str = ""  # model family named in refusals (empty: the pipeline class name says it)
    cfg_above: float = 1.0  # guidance runs when the guidance argument exceeds this (Z-Image: 0)
    list_batch: bool = False  # the denoiser takes its batch as lists of per-image tensors (Z-Image)
    # call arguments benchmarks set: generate at the requested size (no resolution bins), captions as given
    bench_call: tuple[tuple[str, object], ...] = ()
    # sizes diffusers' own check_inputs requires: multiples of size_multiple pixels (raises otherwise: SD, SDXL,
    # PixArt 8, Sana 32), and of latent_multiple latent pixels (Flux, Flux.2, Qwen-Image resize otherwise)
    size_multiple: int = 1
    latent_multiple: int = 1
    # the denoiser config flag under which guidance_scale is an input (Flux-dev, Qwen-Image): without it the
    # model ignores guidance_scale (FLUX.1-schnell), so a call asking for guidance is refused
    guidance_embeds_flag: str = ""
    # separate-call guidance (cfg_sequence) runs only with a negative prompt (Flux, Qwen-Image true CFG), and
    # not when this pipeline config flag is set (Flux.2 Klein: is_distilled)
    cfg_needs_negative: bool = False
    cfg_off_config: str = ""
    # the side a call without height/width generates, where the pipeline keeps no default_sample_size: the
    # denoiser config key holding it in latent pixels (CogVideoX: sample_height), else default_height pixels
    # (Z-Image's own fallback: 1024)
    sample_size_key: str = "sample_size"
    default_height: int = 0


_SD = PipelineFacts("prompt", ("uncond", "cond"), 7.5, size_multiple=8)
_SDXL = PipelineFacts("prompt", ("uncond", "cond"), 5.0, size_multiple=8)
# Call arguments that take images, per variant (by pipeline class name without the SD/SDXL prefix).
_IMAGE_INPUTS = {
    "Pipeline": (),
    "Img2ImgPipeline": ("image",),
    "InpaintPipeline": ("image", "mask_image"),
    "ControlNetPipeline": ("image",),
    "ControlNetImg2ImgPipeline": ("image", "control_image"),
    "ControlNetInpaintPipeline": ("image", "mask_image", "control_image"),
    "AdapterPipeline": ("image",),
}

PIPELINES: dict[str, PipelineFacts] = {
    # Stable Diffusion (XL) and its variants batch guidance as (uncond, cond) like text-to-image.
    **{
        f"{prefix}{variant}": dataclasses.replace(base, image_inputs=images)
        for prefix, base in (("StableDiffusion", _SD), ("StableDiffusionXL", _SDXL))
        for variant, images in _IMAGE_INPUTS.items()
    },
    "DiTPipeline": PipelineFacts("class_labels", ("cond", "uncond"), 4.0, num_classes=10),
    "DDPMPipeline": PipelineFacts("batch_size"),
}

# Flow-matching transformers. Flux (dev-style) embeds guidance_scale and runs one branch; true CFG
# (true_cfg_scale > 1 with a negative prompt; default 1: off) runs a second, uncond call per step, as
# Qwen-Image does by default. default_guidance is the default of guidance_arg.
_FLUX = PipelineFacts(
    "prompt",
    (),
    1.0,
    cfg_sequence=("cond", "uncond"),
    guidance_arg="true_cfg_scale",
    cfg_needs_negative=True,
    passes_sigmas="always",
    passes_mu=True,
    family="Flux",
    latent_multiple=2,
    guidance_embeds_flag="guidance_embeds",
)
_SD3 = PipelineFacts("prompt", ("uncond", "cond"), 7.0, family="Stable Diffusion 3")
_QWEN = PipelineFacts(
    "prompt",
    (),
    4.0,
    cfg_sequence=("cond", "uncond"),
    guidance_arg="true_cfg_scale",
    cfg_needs_negative=True,
    passes_sigmas="always",
    passes_mu=True,
    family="Qwen-Image",
    latent_multiple=2,
    guidance_embeds_flag="guidance_embeds",
)
_EXACT_SIZE = (("use_resolution_binning", False), ("clean_caption", False))
_NOISING = ("scale_noise",)  # flow img2img/inpaint noise the init image with the FlowMatch schedulers' scale_noise
_ZIMAGE = PipelineFacts(
    "prompt",
    ("cond", "uncond"),
    5.0,
    family="Z-Image",
    cfg_above=0.0,
    passes_sigmas="list",
    list_batch=True,
    passes_mu=True,
    latent_multiple=2,
    default_height=1024,
)
_FLOW_VARIANTS = {
    "FluxPipeline": dataclasses.replace(_FLUX, passes_sigmas="unless-flow-sigmas"),
    "FluxImg2ImgPipeline": dataclasses.replace(_FLUX, image_inputs=("image",), scheduler_methods=_NOISING),
    "FluxInpaintPipeline": dataclasses.replace(
        _FLUX, image_inputs=("image", "mask_image"), scheduler_methods=_NOISING
    ),
    "FluxControlNetPipeline": dataclasses.replace(_FLUX, image_inputs=("control_image",)),
    "FluxFillPipeline": dataclasses.replace(_FLUX, image_inputs=("image", "mask_image"), scheduler_methods=_NOISING),
    "Flux2Pipeline": PipelineFacts(
        "prompt", (), 4.0, passes_sigmas="unless-flow-sigmas", passes_mu=True, family="Flux.2", latent_multiple=2
    ),
    "Flux2KleinPipeline": PipelineFacts(
        "prompt",
        (),
        4.0,
        cfg_sequence=("cond", "uncond"),
        latent_multiple=2,
        cfg_off_config="is_distilled",
        passes_sigmas="unless-flow-sigmas",
        passes_mu=True,
        family="Flux.2",
    ),
    "StableDiffusion3Pipeline": _SD3,
    "StableDiffusion3Img2ImgPipeline": dataclasses.replace(_SD3, image_inputs=("image",), scheduler_methods=_NOISING),
    "StableDiffusion3InpaintPipeline": dataclasses.replace(
        _SD3, image_inputs=("image", "mask_image"), scheduler_methods=_NOISING
    ),
    "StableDiffusion3ControlNetPipeline": dataclasses.replace(_SD3, image_inputs=("control_image",)),
    "StableDiffusion3ControlNetInpaintingPipeline": dataclasses.replace(
        _SD3, image_inputs=("control_image", "control_mask")
    ),
    "QwenImagePipeline": _QWEN,
    "QwenImageImg2ImgPipeline": dataclasses.replace(_QWEN, image_inputs=("image",), scheduler_methods=_NOISING),
    "QwenImageInpaintPipeline": dataclasses.replace(
        _QWEN, image_inputs=("image", "mask_image"), scheduler_methods=_NOISING
    ),
    "ZImagePipeline": _ZIMAGE,
    "ZImageImg2ImgPipeline": dataclasses.replace(_ZIMAGE, image_inputs=("image",), scheduler_methods=_NOISING),
    "SanaPipeline": PipelineFacts(
        "prompt", ("uncond", "cond"), 4.5, family="Sana", bench_call=_EXACT_SIZE, size_multiple=32
    ),
    "PixArtSigmaPipeline": PipelineFacts(
        "prompt", ("uncond", "cond"), 4.5, family="PixArt-Sigma", bench_call=_EXACT_SIZE, size_multiple=8
    ),
}
PIPELINES.update(_FLOW_VARIANTS)

# Video pipelines (``output.frames``). Wan runs guidance as a second call per step (cond, then uncond) whenever
# guidance_scale > 1; HunyuanVideo embeds guidance like Flux-dev and runs true CFG only with a negative prompt;
# CogVideoX (a v-prediction DDIM model) and LTX-Video batch (uncond, cond).
_VIDEO_PIPELINES = {
    "WanPipeline": PipelineFacts("prompt", (), 5.0, cfg_sequence=("cond", "uncond"), family="Wan", latent_multiple=2),
    "CogVideoXPipeline": PipelineFacts(
        "prompt",
        ("uncond", "cond"),
        6.0,
        family="CogVideoX",
        latent_multiple=2,
        size_multiple=8,
        sample_size_key="sample_height",
    ),
    "LTXPipeline": PipelineFacts(
        "prompt", ("uncond", "cond"), 3.0, family="LTX-Video", passes_sigmas="always", passes_mu=True, size_multiple=32
    ),
    "HunyuanVideoPipeline": PipelineFacts(
        "prompt",
        (),
        1.0,
        cfg_sequence=("cond", "uncond"),
        guidance_arg="true_cfg_scale",
        cfg_needs_negative=True,
        passes_sigmas="always",
        family="HunyuanVideo",
        guidance_embeds_flag="guidance_embeds",
        latent_multiple=2,
    ),
}
# Image-to-video: the text-to-video facts, plus the first frame as an image input.
_VIDEO_PIPELINES["WanImageToVideoPipeline"] = dataclasses.replace(
    _VIDEO_PIPELINES["WanPipeline"], image_inputs=("image",)
)
_VIDEO_PIPELINES["LTXImageToVideoPipeline"] = dataclasses.replace(
    _VIDEO_PIPELINES["LTXPipeline"], image_inputs=("image",)
)
_VIDEO_PIPELINES["CogVideoXImageToVideoPipeline"] = dataclasses.replace(
    _VIDEO_PIPELINES["CogVideoXPipeline"], image_inputs=("image",)
)
PIPELINES.update(_VIDEO_PIPELINES)
PIPELINES["StableDiffusionPipeline"] = dataclasses.replace(
    PIPELINES["StableDiffusionPipeline"], prompt_embeds=("prompt_embeds", "negative_prompt_embeds")
)

# Attribute names under which pipelines keep their denoiser, in lookup order.
DENOISER_ATTRS = ("unet", "transformer")
# Attribute names of text encoders (prompt cache, profiling).
TEXT_ENCODER_ATTRS = ("text_encoder", "text_encoder_2")


def spatial_factor(pipe) -> int:
    """Pixels per latent pixel: the VAE's spatial downsampling (image pipelines' ``vae_scale_factor``, video
    pipelines' ``vae_scale_factor_spatial`` or LTX's ``vae_spatial_compression_ratio``); 1 in pixel space."""
    for name in ("vae_scale_factor", "vae_scale_factor_spatial", "vae_spatial_compression_ratio"):
        value = getattr(pipe, name, None)
        if value:
            return int(value)
    return 1


def register_pipeline(facts: PipelineFacts):
    """Class decorator giving a pipeline class defined outside diffusers (the zoo's own) its ``facts``, where the
    class is defined: the core names no such pipeline.

    Example::

        @register_pipeline(PipelineFacts("batch_size"))
        class MyPipeline(DiffusionPipeline): ...
    """

    def register(cls):
        PIPELINES[cls.__name__] = facts
        return cls

    return register


def pipeline_facts(pipe) -> PipelineFacts:
    name = type(pipe).__name__
    if name not in PIPELINES:
        raise UnsupportedModelError(f"no pipeline facts for {name}; supported: {', '.join(sorted(PIPELINES))}")
    return PIPELINES[name]


def find_denoiser(pipe):
    """(attribute name, module) of the pipeline's denoiser."""
    for attr in DENOISER_ATTRS:
        module = getattr(pipe, attr, None)
        if module is not None:
            return attr, module
    raise UnsupportedModelError(f"{type(pipe).__name__} has no denoiser under any of {DENOISER_ATTRS}")


def cfg_enabled(pipe, call_kwargs: dict) -> bool:
    """Whether this call batches guidance branches, from the pipeline's facts and the call's guidance_scale."""
    facts = PIPELINES.get(type(pipe).__name__)
    if facts is None or not facts.cfg_layout:
        return False
    scale = call_kwargs.get(facts.guidance_arg, facts.default_guidance)
    _, denoiser = find_denoiser(pipe)
    # An LCM-distilled UNet takes guidance as an embedding instead of a batched branch.
    return scale > facts.cfg_above and getattr(denoiser.config, "time_cond_proj_dim", None) is None


def separate_cfg(pipe, call_kwargs: dict) -> bool:
    """Whether this call runs guidance as separate denoiser calls per step (``cfg_sequence``: true CFG)."""
    facts = PIPELINES.get(type(pipe).__name__)
    if facts is None or not facts.cfg_sequence:
        return False
    scale = call_kwargs.get(facts.guidance_arg, facts.default_guidance)
    negative = any(call_kwargs.get(k) is not None for k in ("negative_prompt", "negative_prompt_embeds"))
    return (
        scale is not None
        and scale > facts.cfg_above
        and (negative or not facts.cfg_needs_negative)
        and not (facts.cfg_off_config and pipe.config.get(facts.cfg_off_config))
    )


def family_name(pipe) -> str:
    """The model family a refusal names: the pipeline facts' family, else the pipeline class."""
    facts = PIPELINES.get(type(pipe).__name__)
    return (facts.family if facts else "") or type(pipe).__name__


def model_prediction(scheduler) -> str:
    """What the denoiser predicts, from the scheduler it was trained with: flow, epsilon, v_prediction or sample.

    Flow-matching schedulers (``FlowMatch*``) and solvers configured with ``prediction_type="flow_prediction"``
    mean flow velocity; otherwise the scheduler's ``prediction_type`` (diffusers' default: epsilon).
    """
    config = scheduler.config
    if type(scheduler).__name__.startswith("FlowMatch") or config.get("prediction_type") == "flow_prediction":
        return "flow"
    return config.get("prediction_type") or "epsilon"


NOISE_PREDICTIONS = ("epsilon", "v_prediction", "sample")


def require_prediction(fp, who: str, allowed: tuple[str, ...] = NOISE_PREDICTIONS) -> str:
    """The model's prediction (``model_prediction`` of the pipeline's scheduler), or a refusal naming ``who``."""
    predicts = model_prediction(fp.pipe.scheduler)
    if predicts not in allowed:
        raise UnsupportedModelError(
            f"{who} needs a model that predicts {' or '.join(allowed)}; the {family_name(fp.pipe)} model's "
            f"{type(fp.denoiser).__name__} predicts {predicts} (its scheduler: {type(fp.pipe.scheduler).__name__})"
        )
    return predicts
