"""Tuned timestep schedules: the tuner, the JSON file, the timesteps(path=...) accelerator and the CLI command."""

import argparse
import json

import pytest
import torch
from diffusers.schedulers import AysSchedules

from fastdiff import FastPipeline
from fastdiff.cli import schedule as cli
from fastdiff.core.calls import CallArgumentError
from fastdiff.core.registry import AcceleratorError
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.schedulers.tuned import TunedSchedule, check_sampler, install_timesteps, model_hash
from fastdiff.schedulers.tuning import Objective, Spacing, references, sample, standard_spacings, tune
from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline, default_scheduler

BATCH = 16


def gmm(seed: int = 0) -> GMMPipeline:
    pipe = GMMPipeline(GMMDenoiser(mixture_seed=seed), default_scheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    schedule = tune(gmm(), "dpm++2m", 4, seeds=1, batch=BATCH, max_evals=60, progress=False)
    path = tmp_path_factory.mktemp("schedule") / "dpm4.json"
    schedule.save(path)
    return schedule, path


def call(fp, **kwargs):
    return fp(batch_size=BATCH, generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs).images


def test_tuned_schedule_is_strictly_monotone_as_the_scheduler_requires(tuned):
    schedule, _ = tuned
    ts = schedule.timesteps
    assert len(ts) == 4 and ts[0] <= 999 and ts[-1] >= 0  # the first timestep is free by default
    assert all(a > b for a, b in zip(ts, ts[1:]))
    assert all(a > b for a, b in zip(schedule.sigmas, schedule.sigmas[1:]))  # ends at sigma 0
    scheduler = make_scheduler("dpm++2m", default_scheduler().config)
    install_timesteps(scheduler, ts, "timesteps")
    scheduler.set_timesteps(4)
    assert scheduler.timesteps.tolist() == ts
    with pytest.raises(AcceleratorError, match="strictly decreasing"):
        TunedSchedule(model_hash="x", sampler="dpm++2m", nfe=3, timesteps=[999, 500, 500], sigmas=[])


def test_json_round_trip_and_the_accelerator_runs_the_tuned_timesteps(tuned):
    schedule, path = tuned
    loaded = TunedSchedule.load(path)
    assert loaded == schedule
    assert json.loads(path.read_text())["model_hash"] == schedule.model_hash
    fp = FastPipeline(gmm())
    plain = call(fp, num_inference_steps=4)
    handle = fp.accelerate(f"scheduler(name=dpm++2m);timesteps(path={path})")
    assert fp.pipe.scheduler.__dict__.get("set_timesteps") is not None
    out = call(fp)  # the step count comes from the schedule
    assert fp.pipe.scheduler.timesteps.tolist() == schedule.timesteps
    direct = fp.pipe(batch_size=BATCH, num_inference_steps=4, output_type="pt").images  # not through fp
    assert fp.pipe.scheduler.timesteps.tolist() == [999, 749, 499, 249]
    assert direct.shape == out.shape
    pipe = gmm()
    pipe.scheduler = make_scheduler("dpm++2m", pipe.scheduler.config)
    expected = sample(pipe, {"batch_size": BATCH}, 0, 4, schedule.timesteps, "timesteps")
    assert torch.equal(out.double(), expected)
    handle.remove()
    assert "set_timesteps" not in fp.pipe.scheduler.__dict__
    assert torch.equal(call(fp, num_inference_steps=4), plain)


def test_objective_is_no_worse_than_its_starting_spacing(tuned):
    schedule, _ = tuned
    objective = schedule.objective
    assert objective["tuned"] <= objective["start"]["value"]
    assert objective["start"]["value"] == min(objective["candidates"].values())
    assert schedule.log[-1][1] == objective["tuned"]
    # Re-evaluated from scratch, the tuned timesteps still score what was recorded.
    pipe = gmm()
    refs, _ = references(pipe, {"batch_size": BATCH}, objective["seeds"], 0)
    pipe.scheduler = make_scheduler("dpm++2m", pipe.scheduler.config)
    fresh = Objective(pipe, "timesteps", {"batch_size": BATCH}, refs, 10, progress=False)
    start = standard_spacings(pipe.scheduler, 4)[objective["start"]["spacing"]]
    assert fresh(schedule.timesteps) == pytest.approx(objective["tuned"], rel=1e-9)
    assert fresh(schedule.timesteps) <= fresh(start)


def test_mismatched_model_sampler_or_nfe_is_refused(tuned):
    _, path = tuned
    other = FastPipeline(gmm(seed=1))
    with pytest.raises(AcceleratorError, match="config hash"):
        other.accelerate(f"scheduler(name=dpm++2m);timesteps(path={path})")
    assert not other.accelerators and "set_timesteps" not in other.pipe.scheduler.__dict__
    fp = FastPipeline(gmm())
    with pytest.raises(AcceleratorError, match="sampler dpm\\+\\+2m .*UniPCMultistepScheduler"):
        fp.accelerate(f"scheduler(name=unipc);timesteps(path={path})")
    with pytest.raises(AcceleratorError, match="use_karras_sigmas"):
        fp.accelerate(f"scheduler(name=dpm++2m-karras);timesteps(path={path})")
    with pytest.raises(AcceleratorError, match="tuned for 4 steps; the step default is 8"):
        fp.accelerate(f"scheduler(name=dpm++2m,steps=8);timesteps(path={path})")
    handle = fp.accelerate(f"scheduler(name=dpm++2m);timesteps(path={path})")
    with pytest.raises(CallArgumentError, match=r"num_inference_steps=8 .*\(4 steps\) allows only 4"):
        call(fp, num_inference_steps=8)  # refused before any model work
    assert fp.allowed_steps().only == {4}
    handle.remove()
    assert fp.allowed_steps().only is None
    with pytest.raises(AcceleratorError, match="'ddim' cannot be tuned: .*fixed stride"):
        check_sampler(make_scheduler("ddim", default_scheduler().config), "ddim")


def test_schedule_listed_before_the_scheduler_is_refused_not_ignored(tuned):
    _, path = tuned
    fp = FastPipeline(gmm())
    fp.pipe.scheduler = make_scheduler("dpm++2m", fp.pipe.scheduler.config)
    fp.accelerate(f"timesteps(path={path});scheduler(name=dpm++2m)")  # swaps the scheduler after schedule
    with pytest.raises(AcceleratorError, match="did not act"):
        call(fp)
    fp.remove_all()
    assert "set_timesteps" not in fp.pipe.scheduler.__dict__


@pytest.mark.parametrize("name", ["dpm++2m", "unipc", "deis", "euler"])
def test_each_route_given_the_schedulers_own_timesteps_is_bit_identical(name):
    pipe = gmm()
    pipe.scheduler = make_scheduler(name, pipe.scheduler.config)
    route = check_sampler(pipe.scheduler, name)
    plain = pipe(batch_size=BATCH, num_inference_steps=5, output_type="pt", generator=torch.manual_seed(0))
    own = pipe.scheduler.timesteps.tolist()
    sigmas = pipe.scheduler.sigmas.clone()
    routed = sample(pipe, {"batch_size": BATCH}, 0, 5, own, route)
    assert torch.equal(pipe.scheduler.sigmas, sigmas)
    assert torch.equal(routed, plain.images.detach().double())


def test_free_start_parameterisation_round_trips_and_pinning_keeps_t_max():
    scheduler = make_scheduler("unipc", default_scheduler().config)
    free, pinned = Spacing(scheduler, 6, free_start=True), Spacing(scheduler, 6)
    for ts in ([940, 710, 418, 159, 41, 4], [999, 500, 200, 80, 20, 1]):
        assert free.timesteps(free.theta(ts)) == ts
    assert pinned.timesteps(pinned.theta([940, 710, 418, 159, 41, 4]))[0] == 999
    kept = tune(gmm(), "unipc", 3, seeds=1, batch=BATCH, max_evals=25, progress=False, free_start=False)
    assert kept.timesteps[0] == 999


def test_standard_spacings_start_at_t_max_and_match_the_ays_list():
    scheduler = make_scheduler("dpm++2m", default_scheduler().config)
    for steps in (4, 6, 10):
        spacings = standard_spacings(scheduler, steps)
        assert {"trailing", "karras", "log-snr", "ays-sd", "ays-sdxl"} <= set(spacings)
        for ts in spacings.values():
            assert len(ts) == steps and ts[0] == 999 and all(a > b for a, b in zip(ts, ts[1:])) and ts[-1] >= 0
    assert standard_spacings(scheduler, 10)["ays-sd"] == AysSchedules["StableDiffusionTimesteps"]


def test_cli_command_writes_the_schedule(tmp_path, capsys):
    model = tmp_path / "gmm"
    gmm().save_pretrained(model)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "s.json"
    args = parser.parse_args(
        [
            "tune-schedule",
            str(model),
            "--sampler",
            "unipc",
            "--nfe",
            "3",
            "--out",
            str(out),
            "--seeds",
            "1",
            "--batch",
            "8",
            "--max-evals",
            "30",
            "--quiet",
        ]
    )
    args.func(args)
    schedule = TunedSchedule.load(out)
    assert schedule.model_hash == model_hash(gmm())  # the config hash survives save_pretrained/from_pretrained
    assert schedule.sampler == "unipc" and schedule.nfe == 3 and schedule.objective["evaluations"] <= 30
    assert "objective log" in capsys.readouterr().err
    fp = FastPipeline.from_pretrained(model, accelerators=f"scheduler(name=unipc);timesteps(path={out})")
    assert fp(batch_size=2, output_type="pt").images.shape == (2, 1, 8, 8)
    assert fp.pipe.scheduler.timesteps.tolist() == schedule.timesteps


def test_cli_refuses_untunable_samplers_with_the_reason_before_loading(tmp_path):
    # every sampler tune-schedule may be asked for is either tuned (test above: unipc; tests of tune: dpm++2m, euler, deis)
    # or refused with why; the model path need not exist, the refusal comes first
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    for sampler, why in (("ddim", "fixed stride"), ("heun", "two denoiser calls"), ("euler-a", "stochastic")):
        args = parser.parse_args(
            [
                "tune-schedule",
                str(tmp_path / "missing"),
                "--sampler",
                sampler,
                "--nfe",
                "4",
                "--out",
                "x.json",
            ]
        )
        with pytest.raises(SystemExit, match=f"'{sampler}' cannot be tuned: .*{why}.*Tunable: dpm\\+\\+2m"):
            args.func(args)


def test_every_preset_rebuilds_from_every_other_with_the_models_betas():
    """A solver's own options (DEIS's algorithm_type, the SDE preset's) must not leak into another class."""
    from fastdiff.schedulers.presets import FLOW_PRESETS, PRESETS

    base = default_scheduler().config
    noise = [p for p in PRESETS if p not in FLOW_PRESETS]
    for first in noise:
        for second in noise:
            rebuilt = make_scheduler(second, make_scheduler(first, base).config)
            assert dict(rebuilt.config) == dict(make_scheduler(second, base).config), (first, second)
    assert standard_spacings(make_scheduler("deis", base), 6)["trailing"][0] == 999
