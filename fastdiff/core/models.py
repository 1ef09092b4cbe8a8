"""Per-model facts, in one place: how each pipeline feeds its denoiser and where each denoiser's blocks are.

Accelerators look facts up here; a model with no entry fails loudly at ``apply`` (``UnsupportedModelError``).

Example::

    from fastdiff.core.models import pipeline_facts
    facts = pipeline_facts(pipe)          # PipelineFacts(inputs="prompt", cfg_layout=("uncond", "cond"), ...)
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedModelError(ValueError):
    """The accelerator has no facts for this model."""


@dataclass(frozen=True)
class PipelineFacts:
    inputs: str  # how a benchmark batch is given: "prompt", "class_labels" or "batch_size"
    cfg_layout: tuple[str, ...] = ()  # branch order when guidance batches both branches; () = no CFG
    default_guidance: float = 1.0  # the pipeline's own default guidance_scale
    default_batch: int = 1  # batch a benchmark uses unless told
    num_classes: int = 0  # labels a benchmark cycles through (class-conditional models)


PIPELINES: dict[str, PipelineFacts] = {
    "StableDiffusionPipeline": PipelineFacts("prompt", ("uncond", "cond"), 7.5),
    "StableDiffusionXLPipeline": PipelineFacts("prompt", ("uncond", "cond"), 5.0),
    "DiTPipeline": PipelineFacts("class_labels", ("cond", "uncond"), 4.0, num_classes=10),
    "DDPMPipeline": PipelineFacts("batch_size"),
    "ClassConditionalPipeline": PipelineFacts("class_labels", ("uncond", "cond"), 1.0, 500, num_classes=10),
    "GMMPipeline": PipelineFacts("batch_size", default_batch=256),
}

# Attribute names under which pipelines keep their denoiser, in lookup order.
DENOISER_ATTRS = ("unet", "transformer")
# Attribute names of text encoders (prompt cache, profiling).
TEXT_ENCODER_ATTRS = ("text_encoder", "text_encoder_2")


def pipeline_facts(pipe) -> PipelineFacts:
    name = type(pipe).__name__
    if name not in PIPELINES:
        raise UnsupportedModelError(
            f"no pipeline facts for {name}; supported: {', '.join(sorted(PIPELINES))}"
        )
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
    scale = call_kwargs.get("guidance_scale", facts.default_guidance)
    _, denoiser = find_denoiser(pipe)
    # An LCM-distilled UNet takes guidance as an embedding instead of a batched branch.
    return scale > 1 and getattr(denoiser.config, "time_cond_proj_dim", None) is None


@dataclass(frozen=True)
class DenoiserFacts:
    family: str  # "unet" (down/mid/up blocks with skips) or "transformer" (a stack of blocks)
    blocks: tuple[str, ...]  # attribute names of the block lists/modules, outermost first
    attention_blocks: tuple[str, ...] = ()  # class names of blocks whose self-attention may be touched


DENOISERS: dict[str, DenoiserFacts] = {
    "UNet2DConditionModel": DenoiserFacts(
        "unet", ("down_blocks", "mid_block", "up_blocks"), ("BasicTransformerBlock",)
    ),
    "UNet2DModel": DenoiserFacts("unet", ("down_blocks", "mid_block", "up_blocks"), ("Attention",)),
    "DiTTransformer2DModel": DenoiserFacts(
        "transformer", ("transformer_blocks",), ("BasicTransformerBlock",)
    ),
}


def denoiser_facts(module, accelerator: str) -> DenoiserFacts:
    """Facts for a denoiser, or UnsupportedModelError naming the accelerator and what is supported."""
    name = type(module).__name__
    if name not in DENOISERS:
        raise UnsupportedModelError(
            f"{accelerator} does not support {name}; supported: {', '.join(sorted(DENOISERS))}"
        )
    return DENOISERS[name]
