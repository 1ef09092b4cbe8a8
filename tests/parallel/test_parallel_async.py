"""parallel(mode=async): AsyncDiff stages on gloo processes (one thread each); warm-up, apply/remove, cfg x async,
a killed worker, refusals. Each multi-process test starts its own workers and is bounded by a timeout."""

from __future__ import annotations

import functools

import helpers
import numpy as np
import pytest
from helpers import assert_dead_rank_ends_the_run

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.core.models import UnsupportedModelError
from fastdiff.parallel.async_ import MAX_RECUTS, balanced_cuts, stage_units
from fastdiff.parallel.async_exchange import BlockingExchange, OverlappedExchange
from fastdiff.parallel.async_plan import head_rows, split_boundaries, stage_seconds
from fastdiff.parallel.launch import launch
from fastdiff.parallel.run import generate
from fastdiff.zoo import build
from fastdiff.zoo.shipped import ensure_digits

STEPS = 6
SAMPLER = f"scheduler(name=dpm++2m,steps={STEPS})"
SD_CALL = {"prompt": ["a red circle", "a blue square"], "num_inference_steps": STEPS, "guidance_scale": 5.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    return {
        "tiny-sd": build("tiny-sd", root / "tiny-sd", size="test"),
        "tiny-sdxl": build("tiny-sdxl", root / "tiny-sdxl", size="test"),
        "tiny-dit": build("tiny-dit", root / "tiny-dit", size="test"),
        "digits": ensure_digits(root / "digits"),
    }


psnr = functools.partial(helpers.psnr, floor=1e-20)  # equal images: 200 dB, not infinity


def _each_model(rank, world, runs: dict, specs: list[str]):
    """Per model: the plain sampler, then every spec (applied and removed in turn), then the plain sampler again."""
    return {name: generate(rank, world, path, [SAMPLER, *specs], call) for name, (path, call) in runs.items()}


def _two_stage_checks(rank, world, runs: dict, specs: list[str]):
    plans = {name: _apply_remove_and_plan(rank, world, *runs[name]) for name in ("tiny-sd", "digits", "tiny-dit")}
    return _each_model(rank, world, runs, specs), plans


@pytest.fixture(scope="module")
def two_stages(models):
    """One launch of 2 workers for the 2-stage checks (starting workers costs more than the calls)."""
    labels = {"class_labels": [1, 7], "num_inference_steps": STEPS}
    runs = {
        "tiny-sd": (str(models["tiny-sd"]), SD_CALL),
        "digits": (str(models["digits"]), dict(labels, guidance_scale=2.0)),
        "tiny-dit": (str(models["tiny-dit"]), dict(labels, guidance_scale=4.0)),
    }
    return launch(_two_stage_checks, 2, runs, STAGED_SPECS, timeout_s=60)


# the image checks pin the cut (balance=layers): a cut on timings follows the machine's load, the images the cut
ASYNC = f"{SAMPLER};parallel(mode=async,devices=2,balance=layers"
WARM_ONLY = f"{ASYNC},warmup={STEPS})"
PIPELINED = f"{ASYNC},warmup=2)"
# activations exchanged every 2nd step
STRIDED = f"{ASYNC},warmup=2,stride=2)"
# the last 2 steps whole again
COOLED = f"{ASYNC},warmup=2,cooldown=2)"
# stale activations carried on linearly to the current timestep
EXTRAPOLATED = f"{ASYNC},warmup=2,extrapolate=1)"


STAGED_SPECS = [WARM_ONLY, PIPELINED, STRIDED, COOLED, EXTRAPOLATED]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_stages_on_sd_class_conditional_unet_and_dit(two_stages):
    check_two_stages(two_stages[0])


@pytest.mark.full  # SDXL's UNet is SD's with more blocks and added conditions: `make test-full` only
@pytest.mark.timeout(120)
def test_two_stages_on_sdxl(models):
    runs = {"tiny-sdxl": (str(models["tiny-sdxl"]), SD_CALL)}
    check_two_stages(launch(_each_model, 2, runs, STAGED_SPECS, timeout_s=60))  # rank 0's {model: images}


def check_two_stages(results: dict) -> None:
    gains = {}  # extrapolate=1 against plain stale activations, dB closer to the single-device images
    for name, result in results.items():
        plain = result[SAMPLER]["images"]
        # warm-up only: every rank runs the whole model, as on one device
        np.testing.assert_array_equal(result[WARM_ONLY]["images"], plain, err_msg=name)
        # 4 of 6 steps on stale activations: close to the single-device images, not equal
        staged = result[PIPELINED]["images"]
        assert np.isfinite(staged).all() and 12 < psnr(staged, plain) < 200, (name, psnr(staged, plain))
        # older activations on every other step: another image, still close
        strided = result[STRIDED]["images"]
        assert 10 < psnr(strided, plain) < 200 and not np.array_equal(strided, staged), name
        # 2 staged steps of 6, then whole again: another image, closer to the single-device one
        cooled = result[COOLED]["images"]
        assert not np.array_equal(cooled, staged) and psnr(cooled, plain) > psnr(staged, plain) - 1, name
        carried = result[EXTRAPOLATED]["images"]
        assert np.isfinite(carried).all() and not np.array_equal(carried, staged), name
        gains[name] = psnr(carried, plain) - psnr(staged, plain)
    # at 6 steps, layer-count cut (measured: tiny-sd +8.8 dB, tiny-sdxl +7.7, tiny-dit +1.1, digits +0.2)
    assert min(gains.values()) > -1 and max(gains.values()) > 5, gains


def _apply_remove_and_plan(rank, world, model, call):
    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)

    def run(kwargs=call):
        import torch

        return fp(**kwargs, output_type="np", generator=torch.Generator().manual_seed(0)).images

    before = run()
    spec = f"{SAMPLER};parallel(mode=async,devices=2)"
    handle = fp.accelerate(spec)
    assert fp.accelerate(spec) is not None  # applying the active config again is a no-op
    state = next(h.state for h in handle.handles if "state" in h.info)
    first = run()  # cut on the warm-up's timings
    first_cut = (dict(state.plan.owner), dict(state.plan.split))
    for _ in range(MAX_RECUTS + 1):  # cut again on each call's staged timings until balanced, then kept
        staged = run()
        if state.settled:
            break
    again = run()
    # every output of stage 0 exchanged, not only those that stage 1 was traced to read
    state.set_exchange(OverlappedExchange(every_output=True))
    exchange_all = run()
    state.set_exchange(BlockingExchange())  # one blocking exchange at the start of each step, not posted broadcasts
    blocking = run()
    state.set_exchange(OverlappedExchange())
    cut = state.plan
    plan = {
        "settled": state.settled,
        "order": cut.order,
        "owner": dict(cut.owner),
        "split": dict(cut.split),
        "stage_costs": cut.stage_seconds(),
        "send": dict(cut.send),
    }
    # the first layer of stage 1 shared by rows with stage 0; without guidance the rows never meet, so the head
    # rows follow the cut with that layer in stage 0 and the others the cut with it in stage 1
    owner = plan["owner"]
    boundary = next(n for n in cut.order if owner[n] == 1)
    cuts = {
        "shared": (owner, {boundary: (0, 0.5)}),
        "later": (owner, {}),
        "sooner": ({**owner, boundary: 0}, {}),
    }
    rows = {}
    for extrapolate in (0, 1):
        state.extrapolate = extrapolate
        for key, cut in cuts.items():
            state.set_cut(*cut)
            rows[key, extrapolate] = run(dict(call, guidance_scale=1.0))
    handle.remove()
    handle = fp.accelerate(f"{SAMPLER};parallel(mode=async,devices=2,balance=layers)")
    state = next(h.state for h in handle.handles if "state" in h.info)
    run()
    by_layers = {"settled": state.settled, "stage_costs": state.plan.stage_seconds()}
    handle.remove()
    return {
        "by_layers": by_layers,
        "before": before,
        "after": run(),
        "first": first,
        "first_cut": first_cut,
        "staged": staged,
        "again": again,
        "exchange_all": exchange_all,
        "blocking": blocking,
        "rows": rows,
        "boundary_splittable": boundary in state.trace.splittable,
        **plan,
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_apply_remove_restores_and_the_stages_are_balanced(two_stages):
    moved = [_check_apply_remove_and_plan(name, out) for name, out in two_stages[1].items()]
    # the two whole-layer cuts differ somewhere, so the row comparison means something (a boundary layer that
    # takes no timestep embedding gives the same images on either side: digits at some cuts)
    assert max(moved) > 3e-5, moved


def _check_apply_remove_and_plan(name, out):
    np.testing.assert_array_equal(out["before"], out["after"])
    np.testing.assert_array_equal(out["staged"], out["again"])  # the plan is kept once settled
    assert out["settled"]
    if out["first_cut"] == (out["owner"], out["split"]):  # the same cut: the first call's images too
        np.testing.assert_array_equal(out["first"], out["staged"])
    assert not np.array_equal(out["staged"], out["before"])
    owners = [out["owner"][n] for n in out["order"]]
    assert owners == sorted(owners) and set(owners) == {0, 1}  # contiguous stages, in the order layers ran
    costs = out["stage_costs"]
    assert max(costs) < 0.8 * sum(costs), costs  # one-sided cuts would leave one stage nearly all the work
    assert out["boundary_splittable"], name
    # each image as under one of the two whole-layer cuts, up to the batch's rounding (measured: under 2e-6 apart,
    # where the two cuts differ by up to 0.1)
    moved = 0.0
    for extrapolate in (0, 1):
        shared, later, sooner = (out["rows"][key, extrapolate] for key in ("shared", "later", "sooner"))
        np.testing.assert_allclose(shared[:1], sooner[:1], atol=1e-5, err_msg=name)
        np.testing.assert_allclose(shared[1:], later[1:], atol=1e-5, err_msg=name)
        moved = max(moved, float(np.abs(sooner - later).max()))
    # only what stage 1 reads is exchanged, and that is all it needs: the same images as exchanging everything
    np.testing.assert_array_equal(out["staged"], out["exchange_all"], err_msg=name)
    # outputs sent as soon as computed (received while the next stage computes): the same as exchanged at once
    np.testing.assert_array_equal(out["staged"], out["blocking"], err_msg=name)
    assert 0 < len(out["send"][0]) and out["send"][1] == [n for n in out["order"] if out["owner"][n] == 1][-1:]
    # balance=layers: equal layer counts (a shared layer's rows split between them), kept from the first call
    assert out["by_layers"]["settled"], name
    assert out["by_layers"]["stage_costs"] == pytest.approx([len(out["order"]) / 2] * 2), name
    return moved


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cfg_times_async_on_four_processes(models):
    runs = {"tiny-sd": (str(models["tiny-sd"]), SD_CALL)}
    warm_only = f"{SAMPLER};parallel(mode=cfg+async,devices=4,warmup={STEPS})"
    pipelined = f"{SAMPLER};parallel(mode=cfg+async,devices=4,warmup=2)"
    out = launch(_each_model, 4, runs, [warm_only, pipelined], timeout_s=60)["tiny-sd"]
    plain = out[SAMPLER]["images"]
    # half-batch kernels of the cfg split round differently (as in test_parallel): equal to float precision
    np.testing.assert_allclose(out[warm_only]["images"], plain, atol=1e-5)
    assert 20 < psnr(out[pipelined]["images"], plain) < 200


FLOW_SAMPLER = f"scheduler(name=flow-euler,steps={STEPS})"
FLOW_CALL = {
    "prompt": ["a red circle", "a blue square"],
    "num_inference_steps": STEPS,
    "height": 32,
    "width": 32,
}


def _flow_models(rank, world, runs: dict):
    specs = [f"{FLOW_SAMPLER};parallel(mode=async,devices=2,warmup={w})" for w in (STEPS, 2)]
    images = {name: generate(rank, world, path, [FLOW_SAMPLER, *specs], call) for name, (path, call) in runs.items()}
    flux = FastPipeline.from_pretrained(runs["tiny-flux"][0], accelerators=specs[1])
    flux.pipe.set_progress_bar_config(disable=True)
    true_cfg = dict(FLOW_CALL, negative_prompt=["blur", "blur"], true_cfg_scale=3.0)
    try:
        flux(**true_cfg)
        refusal = None
    except AcceleratorError as error:
        refusal = str(error)
    return images, (refusal, flux.context.nfe)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_stages_on_flow_transformers(tmp_path):
    """SD3 (joint blocks, batched guidance) and Flux (dual- then single-stream blocks) in two stages; Flux's
    true CFG (cond and uncond as separate calls) is refused: one set of stale activations cannot serve both."""
    runs = {
        "tiny-sd3": (str(build("tiny-sd3", tmp_path / "sd3", size="test")), dict(FLOW_CALL, guidance_scale=5.0)),
        "tiny-flux": (str(build("tiny-flux", tmp_path / "flux", size="test")), FLOW_CALL),
    }
    images, (refusal, nfe) = launch(_flow_models, 2, runs, timeout_s=90)
    for name, out in images.items():
        plain = out[FLOW_SAMPLER]["images"]
        warm, staged = (out[f"{FLOW_SAMPLER};parallel(mode=async,devices=2,warmup={w})"]["images"] for w in (STEPS, 2))
        np.testing.assert_array_equal(warm, plain, err_msg=name)
        # measured 64 dB (SD3) and 75 dB (Flux) at 6 steps
        assert np.isfinite(staged).all() and 30 < psnr(staged, plain) < 200, (name, psnr(staged, plain))
    assert refusal and "separate" in refusal and "true_cfg_scale" in refusal, refusal
    assert nfe == 0  # refused before the denoiser ran


# The other flow-transformer families and the video families, at their default samplers; Wan and Flux.2 Klein
# run guidance as separate calls, so they are staged at guidance 1 and refused above it.
STAGED_FAMILIES = {
    "tiny-flux2": {},
    "tiny-qwen-image": {},
    "tiny-zimage": {},
    "tiny-sana": {},
    "tiny-pixart-sigma": dict(use_resolution_binning=False),
    "tiny-wan": dict(guidance_scale=1.0, num_frames=9),
    "tiny-cogvideox": dict(num_frames=9),
    "tiny-ltx": dict(num_frames=9),
    "tiny-hunyuan-video": dict(num_frames=9),
}
STAGED = "parallel(mode=async,devices=2,warmup=2)"


def _families(rank, world, runs: dict, refused: tuple[str, dict]):
    images = {name: generate(rank, world, path, ["", STAGED], call) for name, (path, call) in runs.items()}
    fp = FastPipeline.from_pretrained(refused[0], accelerators=STAGED)
    fp.pipe.set_progress_bar_config(disable=True)
    try:
        fp(**refused[1])
        return images, None
    except AcceleratorError as error:
        return images, str(error)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_stages_on_every_other_flow_and_video_family(tmp_path):
    """Each family's stage units (models.py) cut in two: staged output close to one process's (measured 45-83 dB
    at 4 steps); Wan's separate guidance calls are refused, naming why."""
    runs = {}
    for name, extra in STAGED_FAMILIES.items():
        call = dict(prompt=["a red circle", "a blue square"], num_inference_steps=4, height=32, width=32, **extra)
        runs[name] = (str(build(name, tmp_path / name, size="test")), call)
    wan_cfg = dict(runs["tiny-wan"][1], guidance_scale=5.0)
    images, refusal = launch(_families, 2, runs, (runs["tiny-wan"][0], wan_cfg), timeout_s=200)
    for name, out in images.items():
        plain, staged = out[""]["images"], out[STAGED]["images"]
        assert np.isfinite(staged).all() and 30 < psnr(staged, plain) < 200, (name, psnr(staged, plain))
    assert refusal and "separate" in refusal and "parallel(mode=cfg)" in refusal, refusal


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_stage_worker_ends_the_call_with_an_error_and_leaves_no_process(models):
    assert_dead_rank_ends_the_run(
        models["tiny-sd"], f"{SAMPLER};parallel(mode=async,devices=2,warmup=2)", SD_CALL, step=3
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("parallel(mode=pipeline)", "mode must be one of cfg, async, cfg\\+async"),
        ("parallel(mode=async,devices=1)", "at least 2 stages"),
        ("parallel(mode=async,devices=2,stages=3)", "devices must be 3"),
        ("parallel(mode=cfg+async,devices=4,stages=3)", "devices must be 6"),
        ("parallel(mode=async,devices=2,warmup=0)", "warmup must be an integer >= 1, got 0"),
        ("parallel(mode=async,devices=2,stride=0)", "stride must be an integer >= 1, got 0"),
        (
            "parallel(mode=cfg,devices=2,warmup=3)",
            "parallel\\(mode=cfg\\): unknown option 'warmup'; allowed: mode, devices",
        ),
        ("parallel(mode=async,devices=2,cooldown=-1)", "cooldown must be an integer >= 0, got -1"),
        ("parallel(mode=cfg,devices=2,cooldown=2)", "unknown option 'cooldown'"),
        (
            "parallel(mode=async,devices=2,extrapolate=2)",
            "extrapolate must be one of 0, 1, got 2",
        ),
        ("parallel(mode=cfg,devices=2,extrapolate=1)", "unknown option 'extrapolate'"),
    ],
)
def test_bad_options_name_the_value(spec, message):
    import fastdiff

    with pytest.raises(AcceleratorError, match=message):
        fastdiff.parse(spec)


def test_refusals_before_any_process_group(models, tmp_path):
    fp = FastPipeline.from_pretrained(models["tiny-sd"])
    with pytest.raises(AcceleratorError, match="torchrun"):
        fp.accelerate("parallel(mode=async,devices=2)")
    with pytest.raises(AcceleratorError, match="devices must be even"):
        fp.accelerate("parallel(mode=cfg+async,devices=3)")
    with pytest.raises(AcceleratorError, match="deepcache.*denoiser.blocks|denoiser.blocks.*deepcache"):
        fp.accelerate("deepcache(interval=2);parallel(mode=async,devices=2)")
    assert not fp.accelerators
    # scheduler presets and parallel(mode=cfg) with deepcache are not refused by the declarations
    assert fastdiff_conflict("deepcache(interval=2)", "parallel(mode=cfg,devices=2)") is None
    assert fastdiff_conflict("scheduler(name=unipc,steps=5)", "parallel(mode=async,devices=2)") is None
    gmm = FastPipeline.from_pretrained(build("gmm", tmp_path / "gmm"))
    with pytest.raises(UnsupportedModelError, match="supported: .*UNet2DConditionModel"):
        gmm.accelerate("parallel(mode=async,devices=2)")
    units = stage_units(fp.denoiser)
    assert "conv_in" in units and any(".attentions." in n for n in units)


def test_per_call_state_is_cleared_by_the_stateful_hook_reset(models):
    """The wrapper resets stateful hooks at every call (diffusers' lifecycle): the async state clears its per-call
    part there, and keeps what spans calls (the staged timings become due for the next re-cut)."""
    from fastdiff.core.hooks import reset_call_state
    from fastdiff.parallel.async_ import ParallelAsync, install_async

    fp = FastPipeline.from_pretrained(models["tiny-sd"])
    handle = install_async(fp, ParallelAsync(devices=2), stage=0, ranks=[0, 1])  # no process group needed yet
    state = handle.state
    state.index, state.fresh, state.settling.times = 5, False, {"conv_in": [0.1]}
    state.extra.known["conv_in"] = [(1.0, None)]
    reset_call_state(fp.denoiser)
    assert state.index == 0 and state.fresh and not state.extra.known
    assert state.settling.due and state.settling.times == {"conv_in": [0.1]}
    handle.remove()


def fastdiff_conflict(a: str, b: str):
    import fastdiff
    from fastdiff.core.registry import conflict_reason

    return conflict_reason(fastdiff.parse(a)[0], fastdiff.parse(b)[0])


def test_balanced_cuts_minimize_the_costliest_stage():
    assert balanced_cuts([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert balanced_cuts([5, 1, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1]
    owners = balanced_cuts([3, 1, 2, 2, 1, 3, 2], 3)
    assert owners == sorted(owners) and set(owners) == {0, 1, 2}
    sums = [sum(c for c, o in zip([3, 1, 2, 2, 1, 3, 2], owners) if o == s) for s in range(3)]
    assert max(sums) == 5  # the best reachable: 14 in 3 contiguous runs cannot be cut below 5


def test_split_boundaries_share_one_layer_so_that_adjacent_stages_even_out():
    # stage 1 heavier: its first layer's head rows go to stage 0
    owner, split = split_boundaries([1.0, 1.0, 3.0], [0, 0, 1], [True] * 3)
    assert owner == [0, 0, 1] and split == pytest.approx({2: 1 / 6})
    assert stage_seconds([1.0, 1.0, 3.0], owner, split, 2) == pytest.approx([2.5, 2.5])
    # stage 0 heavier: its last layer moves over and is shared from there
    owner, split = split_boundaries([1.0, 2.0, 1.0, 1.0], [0, 0, 1, 1], [True] * 4)
    assert owner == [0, 1, 1, 1] and split == pytest.approx({1: 0.75})
    assert stage_seconds([1.0, 2.0, 1.0, 1.0], owner, split, 2) == pytest.approx([2.5, 2.5])
    # a layer without the batch first is never shared; a stage keeps at least one whole layer
    assert split_boundaries([1.0, 1.0, 3.0], [0, 0, 1], [True, True, False]) == ([0, 0, 1], {})
    assert split_boundaries([3.0, 1.0, 1.0], [0, 1, 1], [True] * 3) == ([0, 1, 1], {})
    # three stages: each boundary evened out in turn, every layer shared at most once
    costs = [2.0, 1.0, 2.0, 2.0, 3.0]
    owner, split = split_boundaries(costs, balanced_cuts(costs, 3), [True] * 5)
    seconds = stage_seconds(costs, owner, split, 3)
    assert max(seconds) < max(stage_seconds(costs, balanced_cuts(costs, 3), {}, 3))
    assert owner == sorted(owner) and set(owner) == {0, 1, 2} and all(0 < f < 1 for f in split.values())
    assert head_rows(0.25, 1000) == 250 and head_rows(0.001, 8) == 1 and head_rows(0.999, 8) == 7


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_devices_runs_parallel_configs_in_workers(models):
    from fastdiff.eval.bench import run_bench

    configs = [("one", SAMPLER), ("warm-only", WARM_ONLY)]
    with pytest.raises(ValueError, match="no config's specs contain parallel"):
        run_bench(models["tiny-sd"], configs[:1], devices=2)
    result = run_bench(models["tiny-sd"], configs, runs=1, warmup=False, devices=2, quality=False)
    one, two = result["configs"]
    assert result["settings"]["devices"] == 2 and two["denoiser_calls"] == STEPS
    assert two["psnr"] > 100  # rank 0's images: the whole model on every rank equals one process to float precision
