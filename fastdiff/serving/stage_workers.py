"""The worker side of ``StagePipeline``: the three stages and the loop each worker process runs.

Stage functions take and return plain dicts of the pipeline's own call arguments, so they use the pipeline's
pieces only: ``encode_prompt`` (text), the pipeline call with ``prompt_embeds`` and ``output_type="latent"``
(denoise, through the FastPipeline and its accelerators), ``vae.decode`` + ``run_safety_checker`` +
``image_processor.postprocess`` (decode), the same calls the pipeline makes on one request.

Example (one process, the stages one after another; ``StagePipeline`` puts them on separate processes)::

    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.serving.stage_workers import STAGE_FUNCTIONS

    fp = FastPipeline.from_pretrained("/tmp/tiny-sd", accelerators="scheduler(name=dpm++2m,steps=4)")
    item = {"prompt": ["a red fox"], "guidance_scale": 5.0, "output_type": "np"}
    for stage in ("text", "denoise", "decode"):
        item = STAGE_FUNCTIONS[stage](fp, item)
    images = item["images"]  # equal to fp(prompt=["a red fox"], guidance_scale=5.0, output_type="np").images
"""

from __future__ import annotations

import os
import queue
import time

import torch

from fastdiff.core.models import PIPELINES, cfg_enabled
from fastdiff.core.tensors import map_tensors

STAGES = ("text", "denoise", "decode")
# Which stages each worker process (rank) runs, per process count, with one denoiser: the cheap ends share one.
LAYOUTS = {2: (("text", "decode"), ("denoise",)), 3: (("text",), ("denoise",), ("decode",))}
# The names of encode_prompt's outputs as call arguments, from the per-pipeline facts (others are refused).
PROMPT_EMBEDS = {name: facts.prompt_embeds for name, facts in PIPELINES.items() if facts.prompt_embeds}
# Call arguments that only the text stage reads (encode_prompt's inputs).
TEXT_ARGUMENTS = ("prompt", "negative_prompt", "clip_skip")
POLL_S = 0.002  # idle wait between sweeps of a worker's input queues


def layout(devices: int, denoisers: int = 1) -> tuple[tuple[str, ...], ...]:
    """The stages of each rank. ``denoisers`` > 1 replicates the denoiser, the slowest stage, on ranks
    1..denoisers (requests alternate between them) while rank 0 runs the text encoder and the VAE decoder."""
    if denoisers == 1 and devices in LAYOUTS:
        return LAYOUTS[devices]
    if denoisers > 1 and devices == denoisers + 1:
        return (("text", "decode"),) + (("denoise",),) * denoisers
    raise ValueError(
        f"devices={devices} with denoisers={denoisers} is not a layout: with one denoiser devices is 2 or 3; "
        f"with N > 1 denoisers devices is N + 1 (text encoder and VAE decoder share rank 0)"
    )


def stage_of(config) -> str:
    """The stage an accelerator config belongs on, from what it declares it touches."""
    if config.touches and all(t.startswith("text_encoder.") for t in config.touches):
        return "text"
    if config.touches and all(t.startswith("vae.") for t in config.touches):
        return "decode"
    return "denoise"


def encode_text(fp, request: dict) -> dict:
    """Text stage: the request with its prompts replaced by the pipeline's own ``encode_prompt`` outputs."""
    pipe = fp.pipe
    scale = (request.get("cross_attention_kwargs") or {}).get("scale")
    with torch.no_grad():
        embeds = pipe.encode_prompt(
            request.get("prompt"),
            pipe._execution_device,
            1,
            cfg_enabled(pipe, request),
            negative_prompt=request.get("negative_prompt"),
            lora_scale=scale,
            clip_skip=request.get("clip_skip"),
        )
    item = {k: v for k, v in request.items() if k not in TEXT_ARGUMENTS}
    names = PROMPT_EMBEDS[type(pipe).__name__]
    item.update({name: e for name, e in zip(names, embeds) if e is not None})
    return item


def denoise(fp, item: dict) -> dict:
    """Denoiser stage: the FastPipeline call (accelerators included) from embeddings to latents."""
    output_type = item.pop("output_type", "pil")
    latents = fp(**item, output_type="latent").images
    return {"latents": latents, "output_type": output_type}


def decode(fp, item: dict) -> dict:
    """Decoder stage: what the pipeline does after its denoising loop, on the latents of one request."""
    pipe, latents, output_type = fp.pipe, item["latents"], item["output_type"]
    if output_type == "latent":
        return {"images": latents}
    with torch.no_grad():
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
        image, nsfw = pipe.run_safety_checker(image, pipe._execution_device, latents.dtype)
        denormalize = [True] * image.shape[0] if nsfw is None else [not flagged for flagged in nsfw]
        return {"images": pipe.image_processor.postprocess(image, output_type=output_type, do_denormalize=denormalize)}


STAGE_FUNCTIONS = {"text": encode_text, "denoise": denoise, "decode": decode}


def _to(device):
    return lambda t: t.to(device)


def stage_device(rank: int, world: int, device: str) -> torch.device:
    """Stage ``rank``'s device: with several CUDA devices, one per rank (as launch's process group sets)."""
    if device == "cuda" and torch.cuda.device_count() >= world:
        return torch.device("cuda", rank)
    return torch.device(device)


def serve(rank: int, world: int, model: str, specs: str, device: str, stages, queues, events, finished, wait_s: float):
    """Worker ``rank``: load the pipeline, apply its stages' accelerators, then move requests along its stages.

    ``stages``: every rank's stages (``layout``). ``queues[i]`` feeds stage ``i`` (``queues[3]`` goes back to the
    caller); ``None`` ends the stream: a stage ends once every producer of its input has sent one, and then
    sends one to each consumer of its output. A stage only takes an item when its output queue has room, so a
    worker running two stages never blocks on one while the other could go on (only single-stage ranks share
    a queue with another producer, so the room of a multi-stage rank's output cannot disappear).
    """
    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.spec import parse

    mine = stages[rank]
    runners = {s: sum(s in ranks for ranks in stages) for s in STAGES}
    producers = [1] + [runners[s] for s in STAGES]  # of each queue
    consumers = [runners[s] for s in STAGES] + [1]
    ends_seen = dict.fromkeys(range(len(STAGES)), 0)
    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    here = stage_device(rank, world, device)
    fp.pipe.to(here)
    configs = [c for c in parse(specs or []) if stage_of(c) in mine]
    if configs:
        fp.accelerate(*configs)
    events.put(("ready", rank, os.getpid()))
    parent = os.getppid()
    open_stages = [STAGES.index(s) for s in mine]
    while open_stages:
        worked = False
        for i in reversed(open_stages):  # later stages first: free the queues downstream
            if queues[i + 1].full():
                continue
            try:
                message = queues[i].get_nowait()
            except queue.Empty:
                continue
            worked = True
            if message is None:
                ends_seen[i] += 1
                if ends_seen[i] == producers[i]:
                    open_stages.remove(i)
                    for _ in range(consumers[i + 1]):
                        queues[i + 1].put(None)
                continue
            index, item = message
            result = STAGE_FUNCTIONS[STAGES[i]](fp, map_tensors(item, _to(here)))
            queues[i + 1].put((index, map_tensors(result, _to("cpu"))))
        if not worked:
            if os.getppid() != parent:  # the caller died: do not outlive it
                return None
            time.sleep(POLL_S)
    finished.wait(wait_s)  # keep the process group until the caller has every image
    return None
