"""parallel(mode=cfg): two gloo processes give the single-process images; refusals; a killed worker."""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
import torch
from helpers import assert_dead_rank_ends_the_run

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.parallel.launch import launch, pin_to_cores
from fastdiff.parallel.run import generate
from fastdiff.zoo import build

CALL = {"prompt": ["a red circle", "a blue square"], "num_inference_steps": 4, "guidance_scale": 5.0}
SPECS = ["scheduler(name=dpm++2m,steps=4)", "scheduler(name=dpm++2m,steps=4);deepcache(interval=2)"]


@pytest.fixture(scope="module")
def tiny_sd(tmp_path_factory):
    return build("tiny-sd", tmp_path_factory.mktemp("par") / "tiny-sd", size="test")


def _single(model, specs):
    return generate(0, 1, str(model), specs, CALL)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_give_the_single_process_images(tiny_sd):
    single = _single(tiny_sd, SPECS)
    two = launch(generate, 2, str(tiny_sd), [f"{s};parallel(mode=cfg,devices=2)" for s in SPECS], CALL)
    for specs in SPECS:  # half-batch kernels round differently: measured max difference 1.4e-6 (pixels in [0, 1])
        np.testing.assert_allclose(
            two[f"{specs};parallel(mode=cfg,devices=2)"]["images"], single[specs]["images"], atol=1e-5, err_msg=specs
        )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_worker_ends_the_call_with_an_error_and_leaves_no_process(tiny_sd):
    assert_dead_rank_ends_the_run(tiny_sd, "parallel(mode=cfg,devices=2)", CALL, step=1)


def test_refusals_name_the_problem(tiny_sd, tmp_path):
    fp = FastPipeline.from_pretrained(tiny_sd)
    with pytest.raises(AcceleratorError, match="torchrun"):
        fp.accelerate("parallel(mode=cfg,devices=2)")
    with pytest.raises(AcceleratorError, match="devices must be 2"):
        fp.accelerate("parallel(mode=cfg,devices=3)")
    with pytest.raises(AcceleratorError, match="mode must be one of"):
        fp.accelerate("parallel(mode=pipeline)")
    with pytest.raises(AcceleratorError, match="cfg-interval|denoiser.batch"):
        fp.accelerate("cfg-interval(start=0.2,end=0.8);parallel(mode=cfg,devices=2)")
    assert not fp.accelerators
    ddpm = FastPipeline.from_pretrained(build("tiny-ddpm", tmp_path / "ddpm", size="test"))
    with pytest.raises(Exception, match="classifier-free guidance"):
        ddpm.accelerate("parallel(mode=cfg,devices=2)")
    with pytest.raises(ValueError, match="devices"):
        launch(generate, 0)
    assert torch.get_num_threads() >= 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_devices_2_writes_the_single_process_images(tiny_sd, tmp_path):
    from PIL import Image

    from fastdiff.cli.main import main

    common = [str(tiny_sd), "--prompt", "a red circle", "--steps", "3", "--guidance", "4", "--seed", "3"]
    main(["generate", *common, "--out", str(tmp_path / "one")])
    main(["generate", *common, "--out", str(tmp_path / "two"), "--devices", "2"])
    one, two = (np.asarray(Image.open(tmp_path / d / "grid.png"), dtype=np.int16) for d in ("one", "two"))
    assert np.abs(one - two).max() <= 1  # 8-bit PNGs of images equal to about 1e-6


def _page_faults_per_forward(rank: int, world: int) -> list[int]:
    """Minor page faults of each of 5 forwards of a conv net whose activations are 64 MB each."""
    import resource

    torch.manual_seed(0)
    conv = [torch.nn.Conv2d(4, 16, 1), torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 4, 1)]
    net = torch.nn.Sequential(conv[0], torch.nn.SiLU(), conv[1], torch.nn.SiLU(), conv[2])
    x, faults = torch.randn(64, 4, 128, 128), []
    with torch.no_grad():
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            net(x)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults


@pytest.mark.full
@pytest.mark.timeout(120)
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_workers_reuse_freed_memory_instead_of_faulting_it_in_again():
    pages = 4 * 64 * 2**20 // 4096  # the four 64 MB activations of one forward
    default = launch(_page_faults_per_forward, 1, retain_memory=False)  # glibc's defaults
    kept = launch(_page_faults_per_forward, 1)
    assert min(default[1:]) > pages // 2, default  # each activation a fresh mapping, faulted in page by page
    assert sum(kept[1:]) < sum(default[1:]) / 10, kept  # the heap grows to its peak, then is reused


def _affinities(rank, world):
    import torch.distributed as dist

    mine = sorted(os.sched_getaffinity(0))
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return everyone


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores and sched_setaffinity",
)
def test_cpu_workers_get_a_core_each_when_there_are_enough():
    cores = sorted(os.sched_getaffinity(0))
    assert launch(_affinities, 2) == [[cores[0]], [cores[1]]]
    try:  # the same function in this process: too few cores changes nothing, else rank r takes group r
        assert pin_to_cores(0, len(cores) + 1, 1) is None and sorted(os.sched_getaffinity(0)) == cores
        assert pin_to_cores(1, 2, 1) == {cores[1]} == os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, cores)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_flow_transformer_with_batched_guidance_gives_the_single_process_images(tmp_path):
    """SD3 batches (uncond, cond) like SD: each rank runs one branch of the flow transformer; Z-Image's batch of
    per-image lists is refused."""
    sd3 = build("tiny-sd3", tmp_path / "sd3", size="test")
    call = dict(CALL, height=32, width=32)
    specs = ["scheduler(name=flow-unipc,steps=4)", "blockcache(mode=interval,interval=2)"]
    single = generate(0, 1, str(sd3), specs, call)
    two = launch(generate, 2, str(sd3), [f"{s};parallel(mode=cfg,devices=2)" for s in specs], call)
    for spec in specs:
        np.testing.assert_allclose(
            two[f"{spec};parallel(mode=cfg,devices=2)"]["images"], single[spec]["images"], atol=1e-5, err_msg=spec
        )
    zimage = FastPipeline.from_pretrained(build("tiny-zimage", tmp_path / "zimage", size="test"))
    with pytest.raises(AcceleratorError, match="lists of per-image tensors"):
        zimage.accelerate("parallel(mode=cfg,devices=2)")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["tiny-ltx", pytest.param("tiny-cogvideox", marks=pytest.mark.full)])
def test_video_transformers_with_batched_guidance_give_the_single_process_frames(name, tmp_path):
    """LTX-Video and CogVideoX batch (uncond, cond) too: one branch per rank gives the one-process frames."""
    call = {
        "prompt": ["a red circle moving left"],
        "num_inference_steps": 3,
        "guidance_scale": 4.0,
        "num_frames": 9,
        "height": 32,
        "width": 32,
    }
    model = build(name, tmp_path / name, size="test")
    specs = ["", "forecast(interval=2,warmup=1)"]
    single = generate(0, 1, str(model), specs, call)
    two = launch(
        generate, 2, str(model), ["parallel(mode=cfg,devices=2)" + (f";{s}" if s else "") for s in specs], call
    )
    for spec in specs:
        frames = two["parallel(mode=cfg,devices=2)" + (f";{spec}" if spec else "")]["images"]
        assert frames.shape == single[spec]["images"].shape and frames.ndim == 5
        np.testing.assert_allclose(frames, single[spec]["images"], atol=1e-5, err_msg=spec)


SEPARATE_CALLS = {  # pipelines that call the denoiser once per guidance branch
    "tiny-wan": dict(guidance_scale=4.0, num_frames=9),
    "tiny-flux": dict(true_cfg_scale=3.0, negative_prompt=["blurry"]),
    "tiny-qwen-image": dict(true_cfg_scale=4.0, negative_prompt=["blurry"]),
    "tiny-hunyuan-video": dict(true_cfg_scale=3.0, negative_prompt=["blurry"], num_frames=5),
}


def _halved_negative(pipe, step, timestep, tensors):
    return {"negative_prompt_embeds": tensors["negative_prompt_embeds"] * 0.5} if step == 1 else {}


def _separate_calls(rank, world, runs: dict):
    out = {
        name: generate(rank, world, path, ["parallel(mode=cfg,devices=2)"], call)
        for name, (path, call) in runs.items()
    }
    fp = FastPipeline.from_pretrained(runs["tiny-wan"][0], accelerators="parallel(mode=cfg,devices=2)")
    fp.pipe.set_progress_bar_config(disable=True)
    try:  # a callback changes the uncond inputs mid-call: the run-ahead branch would be wrong, so the call fails
        fp(
            **runs["tiny-wan"][1],
            callback_on_step_end=_halved_negative,
            callback_on_step_end_tensor_inputs=["latents", "negative_prompt_embeds"],
        )
        return out, None, fp.context.nfe
    except AcceleratorError as error:
        return out, str(error), fp.context.nfe


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_separate_guidance_calls_run_one_per_rank_with_the_single_process_output(tmp_path):
    """Wan, and Flux's, Qwen-Image's and HunyuanVideo's true CFG, call the denoiser once per branch: from the second step each rank
    runs one branch at the step's first call; the output equals one process's bit for bit."""
    runs = {}
    for name, extra in SEPARATE_CALLS.items():
        call = dict(prompt=["a red circle moving left"], num_inference_steps=4, height=32, width=32, **extra)
        runs[name] = (str(build(name, tmp_path / name, size="test")), call)
    two, refusal, nfe = launch(_separate_calls, 2, runs, timeout_s=200)
    for name, (path, call) in runs.items():
        single = generate(0, 1, path, [""], call)[""]["images"]
        np.testing.assert_array_equal(two[name]["parallel(mode=cfg,devices=2)"]["images"], single, err_msg=name)
    assert refusal and "(encoder_hidden_states changed)" in refusal, refusal
    assert nfe == 2 + 1 + 1  # step 0 whole (2 calls), step 1 run ahead (1 per rank), failed at step 2's second call


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_writes_video_clips_and_devices_2_splits_wans_guidance_calls(tmp_path):
    """`fastdiff generate` on a video model writes an animated GIF per clip and a grid of their frames; with
    --devices 2 Wan's cond and uncond calls run on two processes and the clip is the one-process clip."""
    from PIL import Image, ImageSequence

    from fastdiff.cli.main import main

    wan = build("tiny-wan", tmp_path / "wan", size="test")
    common = [
        str(wan),
        "--prompt",
        "a red circle moving left",
        "--steps",
        "3",
        "--frames",
        "5",
        "--guidance",
        "4",
        "--height",
        "32",
        "--width",
        "32",
    ]
    main(["generate", *common, "--out", str(tmp_path / "one")])
    main(["generate", *common, "--out", str(tmp_path / "two"), "--devices", "2"])
    clips = []
    for d in ("one", "two"):
        with Image.open(tmp_path / d / "clip_000.gif") as gif:
            clips.append(np.stack([np.asarray(f.convert("RGB"), dtype=np.int16) for f in ImageSequence.Iterator(gif)]))
        assert (tmp_path / d / "grid.png").exists()
    assert clips[0].shape == (5, 32, 32, 3)
    np.testing.assert_array_equal(clips[0], clips[1])
