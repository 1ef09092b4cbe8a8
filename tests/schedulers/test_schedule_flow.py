"""Tuned schedules on flow-matching models: tune() on gmm-flow, timesteps(path=...) on flow samplers, refusals."""

import argparse
import dataclasses

import numpy as np
import pytest
import torch

from fastdiff import FastPipeline
from fastdiff.cli import schedule as cli
from fastdiff.core.models import PIPELINES
from fastdiff.core.registry import AcceleratorError
from fastdiff.schedulers.presets import make_scheduler
from fastdiff.schedulers.tuned import TunedSchedule, check_sampler, install_timesteps, model_hash
from fastdiff.schedulers.tuning import sample, tune
from fastdiff.schedulers.tuning_flow import flow_spacings
from fastdiff.zoo.gmm import GMMDenoiser, GMMPipeline
from fastdiff.zoo.gmm import default_scheduler as noise_scheduler
from fastdiff.zoo.gmm_flow import (
    GMMFlowDenoiser,
    GMMFlowPipeline,
    default_scheduler,
    exact_samples,
    initial_noise,
    ode_error,
)

BATCH = 16
FLOW = ("flow-euler", "flow-dpm++2m", "flow-unipc")
HAND = [950, 700, 380, 120]  # a hand-made flow schedule: sigmas 0.95, 0.7, 0.38, 0.12


def flow_pipe(seed: int = 0, shift: float = 1.0) -> GMMFlowPipeline:
    pipe = GMMFlowPipeline(GMMFlowDenoiser(mixture_seed=seed), default_scheduler(shift))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(fp, **kwargs):
    return fp(batch_size=BATCH, generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs).images


def hand_schedule(tmp_path, sampler: str, pipe=None, timesteps=HAND) -> str:
    sigmas = [t / 1000 for t in timesteps] + [0.0]
    schedule = TunedSchedule(model_hash(pipe or flow_pipe()), sampler, len(timesteps), timesteps, sigmas)
    path = tmp_path / f"{sampler}.json"
    schedule.save(path)
    return str(path)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    schedule = tune(flow_pipe(), "flow-unipc", 4, seeds=1, batch=BATCH, max_evals=60, progress=False)
    path = tmp_path_factory.mktemp("schedule") / "unipc4.json"
    schedule.save(path)
    return schedule, path


def test_tuning_on_gmm_flow_beats_the_default_spacing_against_the_exact_solve(tuned):
    schedule, _ = tuned
    assert schedule.objective["reference"] == "exact flow ODE solve (DOP853)"
    assert schedule.objective["tuned"] <= schedule.objective["start"]["value"]
    ts = schedule.timesteps
    assert len(ts) == 4 and 999 >= ts[0] and ts[-1] >= 1 and all(a > b for a, b in zip(ts, ts[1:]))
    assert schedule.sigmas == pytest.approx([t / 1000 for t in ts] + [0.0])
    pipe = flow_pipe()
    pipe.scheduler = make_scheduler("flow-unipc", pipe.scheduler.config)
    seed = schedule.objective["seeds"][0]
    exact = exact_samples(pipe, initial_noise(pipe, BATCH, seed))
    default = ode_error(sample(pipe, {"batch_size": BATCH}, seed, 4), exact)
    error = ode_error(sample(pipe, {"batch_size": BATCH}, seed, 4, ts, "flow"), exact)
    assert error == pytest.approx(schedule.objective["tuned"], rel=1e-9)  # what the search recorded
    assert error < 0.9 * default  # 60 evaluations on 16 samples: 18% lower than UniPC's own spacing


@pytest.mark.parametrize("sampler", FLOW)
def test_schedule_installs_exactly_the_tuned_sigmas_and_remove_restores(tmp_path, sampler):
    path = hand_schedule(tmp_path, sampler)
    fp = FastPipeline(flow_pipe())
    plain = call(fp, num_inference_steps=4)
    seen = []

    def record(module, args, kwargs):
        scheduler = fp.pipe.scheduler
        seen.append((scheduler.timesteps.clone(), scheduler.sigmas.clone(), args[1] if len(args) > 1 else None))

    hook = fp.denoiser.register_forward_pre_hook(record, with_kwargs=True)
    handle = fp.accelerate(f"scheduler(name={sampler});timesteps(path={path})")
    out = call(fp)  # the step count comes from the schedule
    timesteps, sigmas, first_t = seen[0]
    expected = torch.cat([torch.tensor(HAND, dtype=torch.float64).div(1000).float(), torch.zeros(1)])
    assert torch.equal(sigmas, expected)  # t / T exactly: no shift, no 1e-6 nudge, the final sigma 0
    assert torch.equal(sigmas, torch.tensor(TunedSchedule.load(path).sigmas, dtype=torch.float32))
    if sampler == "flow-euler":  # FlowMatchEuler hands the model sigma * T in float32, as its own spacing
        assert torch.equal(timesteps, expected[:-1] * 1000)
    else:  # DPM-Solver and UniPC hand it integers: here exactly t, not a truncation of sigma * T
        assert timesteps.dtype == torch.int64 and timesteps.tolist() == HAND
    assert float(first_t) == pytest.approx(950, abs=1e-3) and len(seen) == 4
    pipe = flow_pipe()
    pipe.scheduler = make_scheduler(sampler, pipe.scheduler.config)
    assert torch.equal(out.double(), sample(pipe, {"batch_size": BATCH}, 0, 4, HAND, "flow"))
    handle.remove()
    hook.remove()
    assert "set_timesteps" not in fp.pipe.scheduler.__dict__
    assert torch.equal(call(fp, num_inference_steps=4), plain)


def test_the_tuned_file_round_trips_through_the_accelerator(tuned):
    schedule, path = tuned
    assert TunedSchedule.load(path) == schedule
    fp = FastPipeline(flow_pipe())
    fp.accelerate(f"scheduler(name=flow-unipc);timesteps(path={path})")
    call(fp)
    assert fp.pipe.scheduler.timesteps.tolist() == schedule.timesteps
    assert fp.pipe.scheduler.sigmas.tolist() == torch.tensor(schedule.sigmas, dtype=torch.float32).tolist()


def test_flow_euler_public_sigmas_route_matches_only_at_shift_1():
    """FlowMatchEuler's set_timesteps(sigmas=) shifts what it is given: equal to the route at shift 1 only."""
    sigmas = np.asarray(HAND, dtype=np.float64) / 1000
    for shift, same in ((1.0, True), (3.0, False)):
        public = make_scheduler("flow-euler", default_scheduler(shift).config)
        public.set_timesteps(sigmas=sigmas)
        routed = make_scheduler("flow-euler", default_scheduler(shift).config)
        install_timesteps(routed, HAND, "flow")
        routed.set_timesteps(4)
        assert routed.sigmas[:-1].tolist() == torch.tensor(sigmas, dtype=torch.float32).tolist()
        assert torch.equal(public.sigmas, routed.sigmas) is same
        assert torch.equal(public.timesteps, routed.timesteps) is same


@pytest.mark.parametrize("sampler", FLOW)
def test_setting_the_arrays_after_set_timesteps_is_all_the_solver_needs(sampler):
    """Each flow scheduler given its own arrays back (the route's mechanism) samples bit-identically."""
    pipe = flow_pipe()
    pipe.scheduler = make_scheduler(sampler, pipe.scheduler.config)
    assert check_sampler(pipe.scheduler, sampler) == "flow"
    plain = sample(pipe, {"batch_size": BATCH}, 0, 5)
    own_t, own_s = pipe.scheduler.timesteps.clone(), pipe.scheduler.sigmas.clone()
    original = pipe.scheduler.set_timesteps

    def set_own(*args, **kwargs):
        original(*args, **kwargs)
        pipe.scheduler.timesteps, pipe.scheduler.sigmas = own_t.clone(), own_s.clone()

    pipe.scheduler.set_timesteps = set_own
    assert torch.equal(sample(pipe, {"batch_size": BATCH}, 0, 5), plain)
    if sampler == "flow-euler":  # at K=4 its own spacing is on the integer grid: t = 1000, 667, 334, 1
        del pipe.scheduler.set_timesteps
        assert torch.equal(
            sample(pipe, {"batch_size": BATCH}, 0, 4, [1000, 667, 334, 1], "flow"),
            sample(pipe, {"batch_size": BATCH}, 0, 4),
        )


def test_model_hash_is_the_flow_convention_shared_by_every_flow_preset():
    pipe = flow_pipe()
    hashes = {model_hash(GMMFlowPipeline(pipe.unet, make_scheduler(n, pipe.scheduler.config))) for n in FLOW}
    assert hashes == {model_hash(pipe)}
    assert model_hash(flow_pipe(shift=3.0)) != model_hash(pipe)
    assert model_hash(flow_pipe(seed=1)) != model_hash(pipe)


def test_mismatches_are_refused(tmp_path, tuned):
    _, path = tuned
    with pytest.raises(AcceleratorError, match="config hash"):
        FastPipeline(flow_pipe(seed=1)).accelerate(f"scheduler(name=flow-unipc);timesteps(path={path})")
    with pytest.raises(AcceleratorError, match="config hash"):  # another shift: another sigma convention
        FastPipeline(flow_pipe(shift=3.0)).accelerate(f"scheduler(name=flow-unipc);timesteps(path={path})")
    fp = FastPipeline(flow_pipe())
    with pytest.raises(AcceleratorError, match="sampler flow-unipc .*DPMSolverMultistepScheduler"):
        fp.accelerate(f"scheduler(name=flow-dpm++2m);timesteps(path={path})")
    with pytest.raises(AcceleratorError, match="sampler flow-unipc .*FlowMatchEulerDiscreteScheduler"):
        fp.accelerate(f"timesteps(path={path})")  # the model's own flow-euler
    assert not fp.accelerators and "set_timesteps" not in fp.pipe.scheduler.__dict__
    gmm = GMMPipeline(GMMDenoiser(), noise_scheduler())
    noise = hand_schedule(tmp_path, "dpm++2m", gmm, [999, 600, 300, 50])
    with pytest.raises(AcceleratorError, match="noise-predicting model .* predicts flow"):
        fp.accelerate(f"timesteps(path={noise})")
    with pytest.raises(AcceleratorError, match="flow-matching model .* predicts epsilon"):
        FastPipeline(gmm).accelerate(f"scheduler(name=dpm++2m);timesteps(path={path})")
    with pytest.raises(AcceleratorError, match="does not fit .*flow-matching model; tune one of flow-euler"):
        tune(flow_pipe(), "dpm++2m", 4, seeds=1, batch=4, max_evals=2, progress=False)
    with pytest.raises(AcceleratorError, match="'flow-heun' cannot be tuned: two denoiser calls"):
        check_sampler(make_scheduler("flow-heun", default_scheduler().config), "flow-heun")
    with pytest.raises(AcceleratorError, match=">= 1"):  # a flow sigma of 0 is the end, not a step
        TunedSchedule(model_hash="x", sampler="flow-euler", nfe=2, timesteps=[500, 0], sigmas=[])


def test_pipelines_passing_their_own_sigmas_are_refused_unless_the_solver_takes_none(tmp_path, monkeypatch):
    facts = dataclasses.replace(PIPELINES["GMMFlowPipeline"], passes_sigmas="unless-flow-sigmas")
    monkeypatch.setitem(PIPELINES, "GMMFlowPipeline", facts)  # as Flux: sigmas to FlowMatchEuler, none to UniPC
    fp = FastPipeline(flow_pipe())
    with pytest.raises(AcceleratorError, match="passes its own sigmas .*flow-dpm\\+\\+2m or flow-unipc"):
        fp.accelerate(f"scheduler(name=flow-euler);timesteps(path={hand_schedule(tmp_path, 'flow-euler')})")
    fp.accelerate(f"scheduler(name=flow-unipc);timesteps(path={hand_schedule(tmp_path, 'flow-unipc')})")


def test_standard_flow_spacings_start_at_the_top_and_decrease():
    for sampler, top in (("flow-euler", 1000), ("flow-dpm++2m", 999)):
        for name, indices in flow_spacings(make_scheduler(sampler, default_scheduler().config), 6).items():
            ts = [i + 1 for i in indices]
            assert ts[0] == top and ts[-1] >= 1 and all(a > b for a, b in zip(ts, ts[1:])), (name, ts)


def test_cli_tunes_a_flow_model(tmp_path, capsys):
    model = tmp_path / "gmm-flow"
    flow_pipe().save_pretrained(model)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "s.json"
    args = parser.parse_args(
        [
            "tune-schedule",
            str(model),
            "--sampler",
            "flow-dpm++2m",
            "--nfe",
            "3",
            "--out",
            str(out),
            "--seeds",
            "1",
            "--batch",
            "8",
            "--max-evals",
            "20",
            "--quiet",
        ]
    )
    args.func(args)
    schedule = TunedSchedule.load(out)
    assert schedule.model_hash == model_hash(flow_pipe()) and schedule.sampler == "flow-dpm++2m"
    assert "exact flow ODE solve" in capsys.readouterr().err
    fp = FastPipeline.from_pretrained(model, accelerators=f"scheduler(name=flow-dpm++2m);timesteps(path={out})")
    assert fp(batch_size=2, output_type="pt").images.shape == (2, 1, 8, 8)
    assert fp.pipe.scheduler.timesteps.tolist() == schedule.timesteps
