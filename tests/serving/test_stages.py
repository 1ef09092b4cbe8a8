"""StagePipeline: pipelined requests give the sequential images; a killed worker; refusals of bad options."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
import pytest
import torch

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.models import UnsupportedModelError
from fastdiff.serving.stage_workers import STAGE_FUNCTIONS, STAGES, stage_of
from fastdiff.serving.stages import StageError, StagePipeline
from fastdiff.zoo import build

SPECS = "scheduler(name=dpm++2m,steps=4);deepcache(interval=2);promptcache(size=4)"


def requests(count: int = 5) -> list[dict]:
    """Fresh requests (fresh generators): guided and unguided, one and two prompts, two images per prompt."""
    return [
        {
            "prompt": [f"a red fox, take {i}"] * (1 + i % 2),
            "guidance_scale": 1.0 if i == 2 else 5.0,
            "num_images_per_prompt": 2 if i == 3 else 1,
            "negative_prompt": ["blurry"] if i == 4 else None,
            "output_type": "np",
            "generator": torch.Generator().manual_seed(i),
        }
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def tiny_sd(tmp_path_factory):
    return build("tiny-sd", tmp_path_factory.mktemp("stages") / "tiny-sd", size="test")


@pytest.fixture(scope="module")
def sequential(tiny_sd):
    """The images of the requests run one after another through FastPipeline (this process, 1 thread)."""
    fp = FastPipeline.from_pretrained(tiny_sd, accelerators=SPECS)
    fp.pipe.set_progress_bar_config(disable=True)
    return [fp(**r).images for r in requests()]


def _gone(pids) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_the_stages_in_one_process_give_the_pipeline_call_bit_for_bit(tiny_sd, sequential):
    fp = FastPipeline.from_pretrained(tiny_sd, accelerators=SPECS)
    fp.pipe.set_progress_bar_config(disable=True)
    for request, expected in zip(requests(), sequential):
        item = request
        for stage in STAGES:
            item = STAGE_FUNCTIONS[stage](fp, item)
        np.testing.assert_array_equal(item["images"], expected)
    routed = {str(c): stage_of(c) for c in fp.accelerators}
    assert routed == {
        "deepcache(interval=2)": "denoise",
        "promptcache(size=4)": "text",
        "scheduler(name=dpm++2m,steps=4)": "denoise",
    }


@pytest.mark.timeout(120)
def test_two_processes_give_the_sequential_images_and_can_be_reused(tiny_sd, sequential):
    with StagePipeline(tiny_sd, accelerators=SPECS, devices=2, queue_size=1) as sp:
        first = sp.map(requests())
        stream = sp.stream(requests())
        early = next(stream)  # a stream left early drops its other images ...
        stream.close()
        again = sp.map(requests()[:2])  # ... so the next one starts clean
        pids = list(sp.pids)
    assert len(first) == len(sequential) and len(pids) == 2
    for got, expected in zip(first + [early] + again, sequential + sequential[:1] + sequential[:2]):
        np.testing.assert_array_equal(got, expected)  # 1 thread per process: bit-identical
    assert _gone(pids)


@pytest.mark.timeout(120)
def test_replicated_denoisers_give_the_sequential_images_in_order(tiny_sd, sequential):
    with StagePipeline(tiny_sd, accelerators=SPECS, devices=3, denoisers=2, queue_size=1) as sp:
        got = sp.map(requests() * 2)
        stream = sp.stream(requests())
        early = next(stream)  # leaving early drops the rest, whichever replica holds it
        stream.close()
        again = sp.map(requests()[1:])
        layout, pids = sp.layout, list(sp.pids)
    assert layout == (("text", "decode"), ("denoise",), ("denoise",)) and len(pids) == 3
    for image, expected in zip(got + [early] + again, sequential * 2 + sequential[:1] + sequential[1:]):
        np.testing.assert_array_equal(image, expected)
    assert len(got) == 2 * len(sequential) and _gone(pids)


@pytest.mark.timeout(120)
def test_a_killed_worker_ends_the_stream_with_an_error_and_leaves_no_process(tiny_sd, sequential):
    start = time.monotonic()
    with pytest.raises(StageError, match=r"rank 1: denoise.*SIGKILL") as failed:
        with StagePipeline(tiny_sd, accelerators=SPECS, devices=3) as sp:
            stream = sp.stream(requests() * 4)
            np.testing.assert_array_equal(next(stream), sequential[0])  # three processes, same images
            os.kill(sp.pids[1], signal.SIGKILL)  # the denoiser's worker (layout(3)[1])
            for _ in stream:
                pass
    assert time.monotonic() - start < 100 and len(failed.value.pids) == 3
    assert _gone(failed.value.pids)
    with pytest.raises(StageError, match="stopped after an error"):
        next(sp.stream(requests()))


def test_bad_options_and_requests_are_refused_before_any_process_starts(tiny_sd, tmp_path):
    for options, message in [
        ({"devices": 1}, "devices=1 with denoisers=1 is not a layout: with one denoiser devices is 2 or 3"),
        ({"devices": 4}, "devices=4 with denoisers=1 is not a layout"),
        ({"devices": 2, "denoisers": 2}, "with N > 1 denoisers devices is N \\+ 1"),
        ({"denoisers": 0}, "denoisers must be a positive integer, got 0"),
        ({"queue_size": 0}, "queue_size must be a positive integer, got 0"),
        ({"threads": 1.5}, "threads must be a positive integer, got 1.5"),
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda'"),
        ({"timeout_s": -1}, "timeout_s must be a positive number"),
    ]:
        with pytest.raises(ValueError, match=message):
            StagePipeline(tiny_sd, **options)
    with pytest.raises(AcceleratorError, match="unknown accelerator 'fastcache'"):
        StagePipeline(tiny_sd, accelerators="fastcache(size=2)")
    with pytest.raises(AcceleratorError, match="process group of its own"):
        StagePipeline(tiny_sd, accelerators="parallel(mode=cfg,devices=2)")
    with pytest.raises(ValueError, match="not a diffusers pipeline directory"):
        StagePipeline(tmp_path)
    ddpm = build("tiny-ddpm", tmp_path / "ddpm", size="test")
    with pytest.raises(UnsupportedModelError, match="DDPMPipeline; supported: StableDiffusionPipeline"):
        StagePipeline(ddpm)
    sp = StagePipeline(tiny_sd)
    with pytest.raises(RuntimeError, match="not started"):
        sp.map(requests(1))
    for request, message in [
        ("a fox", "a request is a dict"),
        (None, "a request is a dict"),
        ({"prompt": "a fox", "steps": 3}, r"request arguments \['steps'\] are not allowed"),
        ({"prompt": "a fox", "prompt_embeds": torch.zeros(1)}, r"\['prompt_embeds'\] are not allowed"),
        ({"guidance_scale": 2.0}, "needs a prompt"),
        (
            {"prompt": "a fox", "output_type": "jpg"},
            "output_type must be one of pil, np, pt, latent, got 'jpg'",
        ),
    ]:
        with pytest.raises((TypeError, ValueError), match=message):
            sp.check_request(request)
