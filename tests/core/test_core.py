"""The core: wrapper, registry, specs, step context, sampler presets, bad input."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import numpy as np
import pytest
import torch
from diffusers.hooks import ModelHook
from helpers import call, call_kwargs, tiny_pipe

import fastdiff
from fastdiff import AcceleratorError, FastPipeline, UnsupportedModelError, load_pipeline
from fastdiff.core.calls import CallArgumentError, max_steps
from fastdiff.core.hooks import install_hook
from fastdiff.core.registry import REGISTRY, available, conflict_reason
from fastdiff.schedulers import PRESETS
from fastdiff.schedulers.presets import FLOW_PRESETS
from fastdiff.zoo import build
from fastdiff.zoo.tiny import PIPELINE_MAKERS

FAMILIES = sorted(PIPELINE_MAKERS)


@pytest.fixture(scope="module")
def pipes():
    return {name: tiny_pipe(name) for name in FAMILIES}


@pytest.fixture
def sd(pipes):
    fp = FastPipeline(pipes["tiny-sd"])
    yield fp
    fp.remove_all()


def test_wrapper_output_equals_raw_pipeline(pipes):
    for name, pipe in pipes.items():
        raw = pipe(**call_kwargs(pipe)).images
        fp = FastPipeline(pipe)
        wrapped = fp(**call_kwargs(pipe))
        assert type(wrapped).__name__ == "ImagePipelineOutput" or hasattr(wrapped, "images")
        np.testing.assert_array_equal(wrapped.images, raw, err_msg=name)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_every_preset(pipes, family, preset):
    fp = FastPipeline(pipes[family])
    original = fp.pipe.scheduler
    if preset in FLOW_PRESETS:  # these noise-predicting models refuse the flow solvers before anything changes
        with pytest.raises(AcceleratorError, match=f"name={re.escape(preset)}.*flow velocity.*predicts epsilon"):
            fp.accelerate(f"scheduler(name={preset},steps=2)")
        assert fp.pipe.scheduler is original and not fp.accelerators
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = fp.accelerate(f"scheduler(name={preset},steps=2)")
    kwargs = call_kwargs(fp.pipe)
    del kwargs["num_inference_steps"]  # the preset's steps are the default
    images = fp(**kwargs).images
    assert np.isfinite(images).all() and images.shape[0] == 2
    assert fp.context.step == fp.context.num_steps >= 2
    assert fp.context.nfe >= 2
    assert type(fp.pipe.scheduler).__name__ == PRESETS[preset][0]
    handle.remove()
    assert fp.pipe.scheduler is original


def test_remove_restores_bit_identical_and_apply_twice_is_once(sd):
    before = sd(**call_kwargs(sd.pipe)).images
    handle = sd.accelerate("scheduler(name=unipc,steps=3)")
    changed = sd(**call_kwargs(sd.pipe)).images
    assert not np.array_equal(before, changed)
    again = sd.accelerate("scheduler(name=unipc,steps=3)")
    assert len(sd.accelerators) == 1
    np.testing.assert_array_equal(sd(**call_kwargs(sd.pipe)).images, changed)
    again.remove()
    handle.remove()
    assert sd.accelerators == ()
    np.testing.assert_array_equal(sd(**call_kwargs(sd.pipe)).images, before)


def test_steps_default_and_explicit_override(sd):
    sd.accelerate("scheduler(name=ddim,steps=4)")
    kwargs = call_kwargs(sd.pipe)
    del kwargs["num_inference_steps"]
    sd(**kwargs)
    assert sd.context.num_steps == 4
    sd(**kwargs, num_inference_steps=2)
    assert sd.context.num_steps == 2


def default_instances():
    out = []
    for name in available():
        cls = REGISTRY[name]
        if all(f.default is not dataclasses.MISSING for f in dataclasses.fields(cls)):
            out.append(cls())
    return out


def test_spec_round_trip_for_every_registered_config():
    configs = default_instances() + [fastdiff.parse(f"scheduler(name={p},steps=7)")[0] for p in PRESETS]
    assert configs
    for config in configs:
        assert fastdiff.parse(str(config)) == [config], str(config)
    joined = ";".join(map(str, configs[:3]))
    assert fastdiff.parse(joined) == configs[:3]


def test_conflicts_are_declared_on_one_side_and_hold_both_ways():
    classes = [REGISTRY[n] for n in available()]
    for a in classes:
        for b in classes:
            if a.spec_name != b.spec_name:  # conflict_reason reads both sides: one declaration per pair
                assert not (b.spec_name in a.conflicts_with and a.spec_name in b.conflicts_with), (a, b)
    for a in default_instances():
        for b in default_instances():
            assert (conflict_reason(a, b) is None) == (conflict_reason(b, a) is None), (a, b)


def test_two_configs_of_one_accelerator_are_refused_before_anything_changes():
    fp = FastPipeline(tiny_pipe("tiny-sd"))
    plain = call(fp, steps=2)
    with pytest.raises(AcceleratorError, match="one tome at a time"):
        fp.accelerate("tome(ratio=0.5,sx=1);tome(ratio=0.5,sx=1,sy=3)")
    assert fp.accelerators == ()
    handle = fp.accelerate("tome(ratio=0.5)")
    fp.accelerate("tome(ratio=0.5)")  # the same config again: a no-op
    with pytest.raises(AcceleratorError, match="one tome at a time"):
        fp.accelerate("tome(ratio=0.3)")
    handle.remove()
    np.testing.assert_array_equal(call(fp, steps=2), plain)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("warp(factor=2)", "unknown accelerator 'warp'"),
        ("scheduler(name=ddim,speed=3)", "unknown option 'speed'"),
        ("scheduler(steps=many)", "'many' is not a valid int"),
        ("scheduler(name=fast)", "choose one of ddim"),
        ("scheduler(steps=0)", "steps must be an integer >= 1 or none, got 0"),
        ("scheduler(name=ddim", "malformed accelerator spec"),
        ("scheduler(steps)", "must be key=value"),
    ],
)
def test_bad_specs_raise_and_change_nothing(sd, spec, message):
    scheduler = sd.pipe.scheduler
    with pytest.raises(AcceleratorError, match=message):
        sd.accelerate(spec)
    assert sd.pipe.scheduler is scheduler and sd.accelerators == ()


def test_conflicting_pair_is_refused_before_anything_changes(sd):
    scheduler = sd.pipe.scheduler
    with pytest.raises(AcceleratorError, match=r"scheduler\(name=ddim.*conflicts with scheduler\(name=unipc"):
        sd.accelerate("scheduler(name=unipc);scheduler(name=ddim)")
    assert sd.pipe.scheduler is scheduler and sd.accelerators == ()


def test_bad_calls(sd):
    kwargs = call_kwargs(sd.pipe)
    for steps in (0, -2, 2.5, "3", True):
        with pytest.raises(CallArgumentError, match="num_inference_steps=.* a positive integer") as error:
            sd(**{**kwargs, "num_inference_steps": steps})
        assert error.value.argument == "num_inference_steps" and isinstance(error.value, ValueError)
    # tiny-sd's DDIM (1000 training steps, leading spacing, steps_offset 1) indexes past its table at 1000
    with pytest.raises(CallArgumentError, match="num_inference_steps=1000 .* at most 999 with this DDIMScheduler"):
        sd(**{**kwargs, "num_inference_steps": 1000})
    assert max_steps(sd.pipe.scheduler) == 999
    factor = sd.size_factor()
    assert factor % 8 == 0  # SD's check_inputs wants multiples of 8 (fuzzing found 4 let through)
    with pytest.raises(CallArgumentError, match=f"height=33 .* a positive multiple of {factor}"):
        sd(**kwargs, height=33, width=32)
    bad = [
        ("guidance_scale", float("nan"), "a finite number"),
        ("guidance_scale", "7", "a finite number"),
        ("num_images_per_prompt", 0, "a positive integer"),
        ("output_type", "jpeg", "one of pil, np, pt, latent"),
        ("generator", [torch.Generator()] * 3, "one generator per image: "),
    ]
    for argument, value, allowed in bad:
        with pytest.raises(CallArgumentError, match=allowed) as error:
            sd(**{**kwargs, argument: value})
        assert error.value.argument == argument
    with pytest.raises(CallArgumentError, match="one generator per image: 4 here"):
        sd(
            **{
                **kwargs,
                "prompt": ["a", "b"],
                "num_images_per_prompt": 2,
                "generator": [torch.Generator()] * 2,
            }
        )
    assert sd.context.call_index == 0  # refused before any model work
    handle = sd.limit_steps("a test limit", only={2, 3})
    with pytest.raises(CallArgumentError, match="num_inference_steps=4 .* a test limit allows only 2, 3"):
        sd(**{**kwargs, "num_inference_steps": 4})
    assert sd.allowed_steps().only == {2, 3} and sd.allowed_steps().maximum == 999
    handle.remove()
    assert sd.allowed_steps().only is None


def test_unsupported_models_are_accelerator_errors_and_video_patches_size():
    assert issubclass(UnsupportedModelError, AcceleratorError)
    fp = FastPipeline(tiny_pipe("tiny-dit"))
    fp.denoiser.register_to_config(patch_size=(1, 2, 2))  # a video transformer patches (frames, height, width)
    assert fp.size_factor() == 2  # DiTPipeline has no vae_scale_factor: the patch alone


def test_lcm_on_non_lcm_model_warns(sd):
    with pytest.warns(UserWarning, match="expects an LCM-distilled model"):
        sd.accelerate("scheduler(name=lcm)")


def test_missing_and_non_pipeline_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FastPipeline.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a diffusers pipeline directory"):
        FastPipeline.from_pretrained(tmp_path / "empty")


class Recorder(ModelHook):
    def __init__(self, context):
        super().__init__()
        self.context, self.seen = context, []

    def pre_forward(self, module, *args, **kwargs):
        c = self.context
        self.seen.append((c.step, c.num_steps, c.timestep, c.branches, args[0].shape[0]))
        return args, kwargs


@pytest.mark.parametrize("guidance, branches", [(7.5, ("uncond", "cond")), (1.0, ("cond",))])
def test_step_context_published_to_hooks(sd, guidance, branches):
    recorder = Recorder(sd.context)
    handle = install_hook(sd.denoiser, recorder, "test.recorder")
    try:
        sd(**call_kwargs(sd.pipe, steps=4, guidance=guidance))
    finally:
        handle.remove()
    timesteps = [float(t) for t in sd.pipe.scheduler.timesteps]
    assert [s[0] for s in recorder.seen] == [0, 1, 2, 3]
    assert all(s[1] == 4 for s in recorder.seen)
    assert [s[2] for s in recorder.seen] == timesteps
    assert all(s[3] == branches and s[4] == 2 * len(branches) for s in recorder.seen)
    assert sd.context.nfe == 4


def test_install_hooks_is_all_or_nothing(sd):
    from fastdiff.core.hooks import has_hook, install_hooks

    blocks = list(sd.denoiser.down_blocks)
    taken = install_hook(blocks[1], Recorder(sd.context), "test.all-or-nothing")
    with pytest.raises(RuntimeError, match="already installed"):  # the second pair fails: the first comes off
        install_hooks([(blocks[0], Recorder(sd.context)), (blocks[1], Recorder(sd.context))], "test.all-or-nothing")
    assert not has_hook(blocks[0], "test.all-or-nothing") and has_hook(blocks[1], "test.all-or-nothing")
    taken.remove()
    group = install_hooks([(b, Recorder(sd.context)) for b in blocks], "test.all-or-nothing")
    assert all(has_hook(b, "test.all-or-nothing") for b in blocks)
    group.remove()
    assert not any(has_hook(b, "test.all-or-nothing") for b in blocks)


def test_gated_hooks_act_only_inside_a_call_with_or_without_new_forward():
    from fastdiff.core.context import StepContext
    from fastdiff.core.hooks import GatedForwardHook, GatedHook, install_hook

    class Twice(ModelHook):  # pre/post only: gated in pre/post, no new_forward in the chain
        def post_forward(self, module, output):
            return output * 2

    class Plus(ModelHook):
        def new_forward(self, module, *args, **kwargs):
            return self.fn_ref.original_forward(*args, **kwargs) + 1

    context, layer, x = StepContext(), torch.nn.Identity(), torch.ones(1)
    twice, plus = (
        install_hook(layer, Twice(), "test.twice", context),
        install_hook(layer, Plus(), "test.plus", context),
    )
    hooks = list(layer._diffusers_hook.hooks.values())
    assert type(hooks[0]) is GatedHook and not hasattr(hooks[0], "new_forward")
    assert type(hooks[1]) is GatedForwardHook
    assert layer(x).item() == 1.0  # outside a call: untouched
    context.active = True
    assert layer(x).item() == 3.0  # plus (registered last, outermost) adds 1 to twice's 1 * 2
    twice.remove()
    plus.remove()
    assert layer(x).item() == 1.0 and "forward" not in layer.__dict__ and "_diffusers_hook" not in layer.__dict__


def test_dit_branch_layout_is_cond_first(pipes):
    fp = FastPipeline(pipes["tiny-dit"])
    fp(**call_kwargs(fp.pipe, guidance=4.0))
    assert fp.context.branches == ("cond", "uncond")


def test_save_and_reload_through_from_pretrained(tmp_path, sd):
    sd.save_pretrained(tmp_path / "saved")
    loaded = FastPipeline.from_pretrained(tmp_path / "saved")
    loaded.pipe.set_progress_bar_config(disable=True)
    np.testing.assert_array_equal(loaded(**call_kwargs(loaded.pipe)).images, sd(**call_kwargs(sd.pipe)).images)
    raw = load_pipeline(tmp_path / "saved")
    assert type(raw).__name__ == type(sd.pipe).__name__


def test_bench_reports_every_key(tmp_path):
    from fastdiff.cli.main import main

    model = build("tiny-sd", tmp_path / "tiny-sd", size="test")
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            str(model),
            "--config",
            "ddim4=scheduler(name=ddim,steps=4)",
            "--config",
            "dpm2=scheduler(name=dpm++2m,steps=2)",
            "--runs",
            "3",
            "--json",
            str(out),
            "--threads",
            "1",
        ]
    )
    result = json.loads(out.read_text())
    rows = result["configs"]
    keys = {
        "name",
        "specs",
        "seconds_median",
        "seconds",
        "denoiser_calls",
        "peak_rss_mb",
        "speedup",
        "psnr",
        "ssim",
    }
    assert [r["name"] for r in rows] == ["ddim4", "dpm2"]
    assert all(keys <= set(r) for r in rows)
    assert rows[0]["psnr"] is None and rows[0]["speedup"] == 1.0
    assert rows[0]["denoiser_calls"] == 4 and rows[1]["denoiser_calls"] == 2
    assert len(rows[1]["seconds"]) == 3 and rows[1]["peak_rss_mb"] > 0
    assert 0 < rows[1]["psnr"] < 100 and -1 <= rows[1]["ssim"] < 1
    # the spread of every ratio, and a verdict that says "level" where the runs overlap
    for row in rows:
        assert row["seconds_min"] <= row["seconds_median"] <= row["seconds_max"]
        assert row["speedup_min"] <= row["speedup_max"] and row["cpu_speedup_min"] <= row["cpu_speedup_max"]
    overlap = min(rows[1]["seconds"]) <= max(rows[0]["seconds"]) and min(rows[0]["seconds"]) <= max(rows[1]["seconds"])
    expected = "level" if overlap else ("faster" if max(rows[1]["seconds"]) < min(rows[0]["seconds"]) else "slower")
    assert rows[0]["speedup_verdict"] == "baseline" and rows[1]["speedup_verdict"] == expected
    assert result["settings"]["alternate"] is True
    assert {"command", "commit", "date", "device", "load"} <= set(result)
    assert result["command"].startswith("python") or "bench" in result["command"]


def test_bench_runs_a_config_on_its_own_compressed_model(tmp_path):
    from fastdiff.compress.recover import compress_model
    from fastdiff.eval.bench import run_bench

    model = build("tiny-sd", tmp_path / "tiny-sd", size="test")
    compress_model(model, tmp_path / "pruned", "prune(ratio=0.5)", recover_steps=0, progress=False)
    result = run_bench(
        model,
        [("plain", ""), ("pruned", ""), ("again", "")],
        steps=2,
        runs=1,
        threads=1,
        models={"pruned": tmp_path / "pruned"},
    )
    plain, pruned, again = result["configs"]
    assert pruned["model"] == str(tmp_path / "pruned") and "model" not in plain
    assert again["psnr"] == float("inf") and pruned["psnr"] < 100  # the pruned weights really ran
    with pytest.raises(ValueError, match="not configs"):
        run_bench(model, [("plain", "")], steps=2, runs=1, models={"typo": tmp_path / "pruned"})


def test_bench_alternates_configs_and_refuses_a_busy_machine(monkeypatch):
    from fastdiff.eval import bench
    from fastdiff.eval.provenance import LoadError

    fp = FastPipeline(tiny_pipe("tiny-sd"))
    order = []
    real = bench._measure
    monkeypatch.setattr(bench, "_measure", lambda fp, name, *a: order.append(name) or real(fp, name, *a))
    configs = [("a", "scheduler(name=ddim,steps=2)"), ("b", "scheduler(name=dpm++2m,steps=2)")]
    result = bench.run_bench(fp, configs, runs=3, quality=False, warmup=False)
    assert order == ["a", "b"] * 3  # rounds, each config once per round
    assert [len(r["seconds"]) for r in result["configs"]] == [3, 3]
    order.clear()
    bench.run_bench(fp, configs, runs=3, quality=False, warmup=False, alternate=False)
    assert order == ["a", "b"]
    monkeypatch.setattr(bench, "load_average", lambda: 99.0)
    monkeypatch.setattr("fastdiff.eval.provenance.load_average", lambda: 99.0)
    with pytest.raises(LoadError, match="max_load 0.5"):
        bench.run_bench(fp, configs, runs=3, quality=False, max_load=0.5)
    assert fp.accelerators == ()  # nothing left applied


def test_every_results_record_refuses_a_load_above_the_named_limit(monkeypatch):
    from fastdiff.eval import provenance as prov

    monkeypatch.setattr(prov, "load_average", lambda: 3.0)
    monkeypatch.setattr(prov, "_LOAD_AT_IMPORT", 0.5)
    monkeypatch.delenv(prov.MAX_LOAD_ENV, raising=False)
    record = prov.with_provenance({"x": 1})  # no limit named: recorded, with its loads
    assert record["x"] == 1 and record["load"] == {"start": 0.5, "end": 3.0}
    threads = torch.get_num_threads()
    assert prov.with_provenance({"x": 1}, max_load=3.0 - threads)["x"] == 1
    monkeypatch.setenv(prov.MAX_LOAD_ENV, str(2.5 - threads))
    with pytest.raises(prov.LoadError, match="FASTDIFF_MAX_LOAD"):
        prov.with_provenance({"x": 1})  # ended above the limit: not recorded
    monkeypatch.setattr(prov, "_LOAD_AT_IMPORT", 9.0)
    monkeypatch.setattr(prov, "load_average", lambda: 0.0)
    with pytest.raises(prov.LoadError, match="load average 9.00"):
        prov.with_provenance({"x": 1})  # started above it
    monkeypatch.setenv(prov.MAX_LOAD_ENV, "busy")
    with pytest.raises(ValueError, match="FASTDIFF_MAX_LOAD must be a number >= 0, got 'busy'"):
        prov.check_load(None)


@pytest.mark.parametrize("preset", ["ddpm", "euler-a", "dpm++2m-sde"])
def test_stochastic_samplers_use_the_callers_generator(sd, preset):
    """diffusers passes generator= only to a step whose signature takes it; the step counter keeps it."""
    raw = sd.pipe.scheduler
    sd.accelerate(f"scheduler(name={preset})")
    first, second = (call(sd, steps=4, seed=7) for _ in range(2))
    np.testing.assert_array_equal(first, second)
    assert np.abs(first - call(sd, steps=4, seed=8)).max() > 1e-3  # the seed matters
    plain = sd.pipe(**call_kwargs(sd.pipe, steps=4, seed=7)).images  # the preset acts on direct calls too
    np.testing.assert_array_equal(first, plain)
    sd.remove_all()
    assert sd.pipe.scheduler is raw or type(sd.pipe.scheduler) is type(raw)


@pytest.mark.parametrize("preset", ["lcm", "euler", "dpm++2m"])
def test_preset_keeps_betas_of_a_scheduler_built_in_memory(preset):
    """A DDPMScheduler() left at its defaults must not get the preset class's default betas (LCM's differ)."""
    from diffusers import DDPMScheduler

    from fastdiff.schedulers.presets import make_scheduler

    source = DDPMScheduler()
    built = make_scheduler(preset, source.config)
    np.testing.assert_allclose(built.alphas_cumprod.numpy(), source.alphas_cumprod.numpy(), rtol=1e-6)


def test_runs_in_process_group_reads_the_declared_kind():
    from fastdiff.core.spec import runs_in_process_group

    assert runs_in_process_group("deepcache(interval=3);parallel(mode=cfg,devices=2)")
    assert not runs_in_process_group("deepcache(interval=3)") and not runs_in_process_group("")
