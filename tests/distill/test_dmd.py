"""fastdiff distill dmd: one-step students by distribution matching (DMD2) and score identity (SiD)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastdiff.cli.main import main
from fastdiff.core.inputs import make_inputs
from fastdiff.distill.common import (
    MANIFEST,
    DistillError,
    fresh_copy,
    load_student,
)
from fastdiff.distill.dmd import dmd
from fastdiff.distill.dmd_loss import dmd_loss_fn, guided_x0
from fastdiff.distill.process import process_for
from fastdiff.distill.progressive import progressive
from fastdiff.train.data import Batches, load_teacher
from fastdiff.train.loop import TrainingDiverged, train
from fastdiff.zoo import build

TINY = {"batch": 2, "save_every": 1, "progress": False}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    root = tmp_path_factory.mktemp("dmd")
    path = build("tiny-ddpm", root / "teacher", size="test")
    progressive(path, root / "prog", start=2, end=1, steps_per_round=2, batch=2, progress=False)
    return path, root / "prog" / "steps-1"


@pytest.fixture(scope="module")
def flow_teacher(tmp_path_factory):
    """A test-size digits-flow, trained once for this file (~12 s): the tests only read it."""
    return build("digits-flow", tmp_path_factory.mktemp("dmd-flow") / "digits-flow", size="test")


def _weights(directory):
    fp = load_student(directory)
    return {k: v.clone() for k, v in fp.denoiser.state_dict().items()}


def _gan_head_after_a_run_that_resumes_exactly(teacher, tmp_path, **options) -> dict:
    """Train ``teacher`` whole and cut in two (killed, resumed): same weights; the GAN head's saved state."""
    dmd(teacher, tmp_path / "whole", **options)
    dmd(teacher, tmp_path / "cut", stop_after=1, **options)
    dmd(teacher, tmp_path / "cut", resume=True, **options)
    first, second = _weights(tmp_path / "whole" / "steps-1"), _weights(tmp_path / "cut" / "steps-1")
    assert all(torch.equal(first[k], second[k]) for k in first)
    saved = torch.load(tmp_path / "whole" / "train" / "checkpoint.pt", weights_only=False)
    return saved["state"]


def test_student_samples_in_one_call_with_its_recorded_sampler(teacher, tmp_path):
    path, init = teacher
    main(
        [
            "distill",
            "dmd",
            str(path),
            str(tmp_path / "s"),
            "--init",
            str(init),
            "--train-steps",
            "2",
            "--batch",
            "2",
            "--regression",
            "0.5",
            "--pairs",
            "4",
            "--pair-steps",
            "2",
            "--ema-decay",
            "0.9",
        ]
    )
    student = tmp_path / "s" / "steps-1"
    info = json.loads((student / MANIFEST).read_text())
    assert info["method"] == "dmd" and info["steps"] == 1 and info["ema"]
    assert info["load_accelerators"] == "scheduler(name=ddim,steps=1)"
    assert (tmp_path / "s" / "train" / "pairs.pt").is_file() and (student / "loss.csv").is_file()
    fp = load_student(student)
    fp.pipe.set_progress_bar_config(disable=True)
    images = fp(batch_size=2, output_type="np", generator=torch.Generator().manual_seed(0)).images
    assert images.shape[0] == 2 and fp.context.nfe == 1
    assert torch.isfinite(torch.as_tensor(images)).all()
    assert json.loads((tmp_path / "s" / MANIFEST).read_text())["done"]


@pytest.mark.parametrize("method", ["dmd", "sid"])
def test_a_killed_run_resumes_to_the_same_weights(teacher, tmp_path, method):
    path, init = teacher
    dmd(path, tmp_path / "whole", init=init, method=method, train_steps=3, **TINY)
    first = dmd(path, tmp_path / "cut", init=init, method=method, train_steps=3, stop_after=2, **TINY)
    assert first["out"] is None and not (tmp_path / "cut" / "steps-1").exists()
    dmd(path, tmp_path / "cut", init=init, method=method, train_steps=3, resume=True, **TINY)
    whole, cut = _weights(tmp_path / "whole" / "steps-1"), _weights(tmp_path / "cut" / "steps-1")
    assert all(torch.equal(whole[k], cut[k]) for k in whole)
    start = _weights(init)
    assert any(not torch.equal(whole[k], start[k]) for k in whole)  # it trained


@pytest.mark.parametrize("method", ["dmd", "sid"])
def test_the_matching_loss_vanishes_when_the_fake_score_is_the_teacher(teacher, method):
    path, init = teacher
    fp = load_teacher(path)
    batches = Batches(fp, path, 2, 0)
    gen = fresh_copy(fp.denoiser)
    fake = fresh_copy(fp.denoiser).requires_grad_(True)
    frozen = torch.optim.SGD(fake.parameters(), lr=0.0)  # the fake score stays equal to the teacher
    cpu = torch.device("cpu")

    def matching_loss():
        make = dmd_loss_fn(
            process_for(fp.pipe.scheduler),
            "sample",
            batches,
            fp.denoiser,
            fake,
            frozen,
            1.0,
            20,
            980,
            1,
            method,
            1.2,
            0.0,
            None,
        )
        return make(gen, torch.Generator().manual_seed(0), cpu)

    loss, shown = matching_loss()
    assert loss.abs().item() < 1e-6 and shown["fake"] > 0
    with torch.no_grad():  # a fake score that differs from the teacher gives a gradient
        for p in fake.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, _ = matching_loss()
    assert loss.abs().item() > 1e-4


def test_bad_input_is_refused_before_training(teacher, tmp_path):
    path, init = teacher
    with pytest.raises(DistillError, match="predicts epsilon.*progressive"):
        dmd(path, tmp_path / "a", **TINY)
    with pytest.raises(DistillError, match="not a one-step student"):
        dmd(path, tmp_path / "b", init=path, **TINY)
    other = build("tiny-sd", tmp_path / "sd", size="test")
    with pytest.raises(DistillError, match="student of another teacher"):
        dmd(other, tmp_path / "c", init=init, **TINY)
    with pytest.raises(DistillError, match="t-range"):
        dmd(path, tmp_path / "d", init=init, t_range=(0.5, 0.2), **TINY)
    with pytest.raises(DistillError, match="method"):
        dmd(path, tmp_path / "e", init=init, method="gan", **TINY)
    with pytest.raises(DistillError, match="not a diffusers pipeline"):
        dmd(tmp_path, tmp_path / "f", init=init, **TINY)
    with pytest.raises(DistillError, match="disjoint"):
        dmd(
            path,
            tmp_path / "h",
            init=init,
            snapshot_every=1,
            selection_seeds=(0, 1),
            report_seeds=(1,),
            **TINY,
        )
    assert not any((tmp_path / n).exists() for n in "abcdefh")
    dmd(path, tmp_path / "g", init=init, train_steps=1, **TINY)
    with pytest.raises(DistillError, match=r"options that differ: train_steps \(saved 1, now 2\)"):
        dmd(path, tmp_path / "g", init=init, train_steps=2, resume=True, **TINY)


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    net = torch.nn.Linear(2, 1)

    def loss_fn(model, g, device):
        step = len(calls)
        calls.append(step)
        out = model(torch.ones(1, 2)).sum()
        return out * float("nan") if step == 3 else out

    calls: list[int] = []
    with pytest.raises(TrainingDiverged, match=r"nan at step 4.*checkpoint.pt \(step 2\)"):
        train(net, loss_fn, 6, lr=1e-2, out_dir=tmp_path, save_every=2, progress=False)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 2 and all(torch.isfinite(v).all() for v in saved["model"].values())


def test_snapshots_are_picked_on_selection_seeds_and_reported_on_others(tmp_path):
    from fastdiff import FastPipeline

    teacher = build("digits", tmp_path / "digits", size="bench")
    progressive(teacher, tmp_path / "prog", start=2, end=1, steps_per_round=1, batch=2, guidance=2.0, progress=False)
    dmd(
        teacher,
        tmp_path / "s",
        init=tmp_path / "prog" / "steps-1",
        guidance=2.0,
        train_steps=2,
        snapshot_every=1,
        pick_images=20,
        **TINY,
    )
    info = json.loads((tmp_path / "s" / "steps-1" / MANIFEST).read_text())
    selection = info["selection"]
    assert selection["candidates"] == ["step-000000", "step-000001", "step-000002"]  # the start is one
    assert selection["selection_seeds"] == [0] and selection["report_seeds"] == [1]
    assert {r["seed"] for r in selection["selection"]} == {0} and info["measured"]["1"]["seed"] == 1
    assert info["measured"]["1"]["snapshot"] == selection["choice"] and info["validated"] == [1]
    fp = FastPipeline.from_pretrained(teacher)
    fp.pipe.set_progress_bar_config(disable=True)
    handle = fp.accelerate(f"student(path={tmp_path / 's' / 'steps-1'})")
    fp(class_labels=[1, 2], guidance_scale=2.0, output_type="np")
    assert fp.context.nfe == 1  # one call, the conditional half only
    handle.remove()


def test_students_are_refused_at_step_counts_they_were_not_validated_for(teacher, tmp_path):
    from fastdiff import AcceleratorError, FastPipeline
    from fastdiff.distill.consistency import consistency

    path, _ = teacher
    consistency(path, tmp_path / "lcm", train_steps=1, batch=2, progress=False)
    info = json.loads((tmp_path / "lcm" / MANIFEST).read_text())
    assert info["validated"] == [1, 2, 4, 8] and set(info["measured"]) == {"1", "2", "4", "8"}
    assert all(row["finite"] and row["seed"] == 1 for row in info["measured"].values())
    fp = FastPipeline.from_pretrained(path)
    fp.pipe.set_progress_bar_config(disable=True)
    with pytest.raises(AcceleratorError, match=r"validated for steps \[1, 2, 4, 8\], not 3.*unvalidated=true"):
        fp.accelerate(f"student(path={tmp_path / 'lcm'},steps=3)")
    handle = fp.accelerate(f"student(path={tmp_path / 'lcm'},steps=3,unvalidated=true)")
    fp(batch_size=1, output_type="np")
    assert fp.context.nfe == 3
    handle.remove()


def test_the_validation_rule_keeps_counts_near_the_best_and_old_students_their_default():
    from fastdiff.core.registry import AcceleratorError
    from fastdiff.distill.validate import check_validated, validated_counts

    assert validated_counts({"steps": 4, "sample_with": {"num_inference_steps": 4}}) == [4]  # saved before
    info = {"validated": [2, 4], "measured": {"1": {"accuracy": 0.236, "fd": 402.6}}}
    with pytest.raises(AcceleratorError, match=r"measured at 1: 23.6% accuracy, FD 402.60"):
        check_validated("student", "/s", info, 1, unvalidated=False)
    check_validated("student", "/s", info, 1, unvalidated=True)
    check_validated("student", "/s", info, 4, unvalidated=False)


def test_a_flow_teacher_gives_a_one_step_flow_student(flow_teacher, tmp_path):
    from fastdiff import FastPipeline

    teacher = flow_teacher
    # regression to the teacher's own flow-Euler samples: the pairs are its 2-step ODE samples of their noises
    reg = dmd(teacher, tmp_path / "r", train_steps=2, regression=1.0, pairs=3, pair_steps=2, **TINY)
    assert reg["train"]["loss_first"] is not None
    pairs = torch.load(tmp_path / "r" / "train" / "pairs.pt", weights_only=False)
    fp = load_teacher(teacher, allow_flow=True)
    fp.pipe.set_progress_bar_config(disable=True)
    process = process_for(fp.pipe.scheduler)
    x, key = pairs["noise"][:1], "hidden_states"
    with torch.no_grad():
        for i, level in enumerate(process.ode_levels(2)):
            now = torch.full((1,), level)
            cond = {k: v[:1] if torch.is_tensor(v) else v for k, v in pairs["cond"].items()}
            x0 = guided_x0(process, fp.denoiser, key, x, now, cond, None, 1.0)
            x = x0 if i == 1 else process.noise(x0, process.noise_from(x, x0, now), torch.full((1,), 0))[0]
    torch.testing.assert_close(x, pairs["sample"][:1], rtol=1e-4, atol=1e-4)
    for method in (
        "dmd",
        "sid",
    ):  # from the teacher's own weights: it predicts velocity, as the generator does
        result = dmd(teacher, tmp_path / method, method=method, guidance=2.0, train_steps=2, **TINY)
        info = json.loads((tmp_path / method / "steps-1" / MANIFEST).read_text())
        assert info["load_accelerators"] == "scheduler(name=flow-euler,steps=1)"
        assert result["train"]["loss_first"] is not None
    fp = FastPipeline.from_pretrained(teacher)
    fp.pipe.set_progress_bar_config(disable=True)
    before = fp(
        prompt=["a seven"],
        output_type="np",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
    )
    handle = fp.accelerate(f"student(path={tmp_path / 'dmd' / 'steps-1'})")
    images = fp(prompt=["a seven", "a two"], guidance_scale=2.0, output_type="np").images
    assert fp.context.nfe == 1 and np.isfinite(images).all()
    handle.remove()
    after = fp(
        prompt=["a seven"],
        output_type="np",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert np.array_equal(before.images, after.images)


def test_a_video_teacher_gives_a_one_step_student_picked_on_frames(tmp_path):
    from fastdiff import FastPipeline

    # moving-digits is a WanPipeline: its calls return .frames, and its snapshots are scored as clips
    teacher = build("moving-digits", tmp_path / "md", size="test")
    dmd(
        teacher,
        tmp_path / "s",
        guidance=1.5,
        train_steps=1,
        regression=0.5,
        pairs=2,
        pair_steps=2,
        snapshot_every=1,
        selection_seeds=(0,),
        report_seeds=(1,),
        pick_images=2,
        **TINY,
    )
    info = json.loads((tmp_path / "s" / "steps-1" / MANIFEST).read_text())
    assert info["selection"]["candidates"] == ["step-000000", "step-000001"]
    assert info["selection"]["report"] and info["selection"]["choice"] in info["selection"]["candidates"]
    fp = FastPipeline.from_pretrained(teacher)
    fp.pipe.set_progress_bar_config(disable=True)
    call = dict(make_inputs(fp.pipe, 2), output_type="np", num_inference_steps=2)  # the model's clip size
    before = fp(**call, generator=torch.Generator().manual_seed(0)).frames
    handle = fp.accelerate(f"student(path={tmp_path / 's' / 'steps-1'})")
    seeded = dict(call, num_inference_steps=1, generator=torch.Generator().manual_seed(0))
    frames = fp(**dict(seeded, guidance_scale=1.0)).frames
    assert fp.context.nfe == 1 and frames.shape == before.shape and np.isfinite(frames).all()
    # guidance 1.5 is baked in: Wan's separate unconditional call must not guide the student again
    guided = fp(**dict(seeded, guidance_scale=1.5, generator=torch.Generator().manual_seed(0))).frames
    assert np.array_equal(guided, frames)
    handle.remove()
    assert np.array_equal(before, fp(**call, generator=torch.Generator().manual_seed(0)).frames)


def test_the_zoo_builds_a_one_step_student_that_runs_on_its_teacher(tmp_path):
    from fastdiff import FastPipeline

    student = build("digits-onestep", tmp_path / "onestep", size="test")
    info = json.loads((student / MANIFEST).read_text())
    assert info["method"] == "dmd" and info["guidance_baked_in"] == 2.0
    fp = FastPipeline.from_pretrained(build("digits", tmp_path / "digits", size="bench"))
    fp.pipe.set_progress_bar_config(disable=True)
    handle = fp.accelerate(f"student(path={student},steps=1)")
    images = fp(class_labels=[0, 9], guidance_scale=2.0, output_type="np").images
    assert fp.context.nfe == 1 and images.shape[0] == 2
    handle.remove()
    flow = build("digits-flow-onestep", tmp_path / "flow-onestep", size="test")  # from a test-size digits-flow
    assert json.loads((flow / MANIFEST).read_text())["guidance_baked_in"] == 1.5
    assert (flow / "transformer" / "diffusion_pytorch_model.safetensors").is_file()


@pytest.mark.parametrize(
    "model, teacher_name, guidance, script",
    [
        ("digits-onestep", "digits", 2.0, "onestep_digits"),
        ("digits-onestep-g1", "digits", 1.0, "onestep_digits"),
        ("digits-flow-onestep", "digits-flow", 1.5, "onestep_flow"),
    ],
)
def test_the_shipped_one_step_students_install_checked_and_sample_digits_in_one_call(
    tmp_path, model, teacher_name, guidance, script
):
    from fastdiff import FastPipeline
    from fastdiff.eval.quality import accuracy, load_reference_eval
    from fastdiff.zoo.shipped import ShippedModelError, install, shipped_models, shipped_table

    data, table, _ = shipped_models()[model]
    assert shipped_table(data, model) == table
    student = build(model, tmp_path / "onestep", size="bench")
    teacher = build(teacher_name, tmp_path / teacher_name, size="bench")
    info = json.loads((student / MANIFEST).read_text())
    assert info["validated"] == [1] and info["measured"]["1"]["seed"] == 1
    assert info["guidance_baked_in"] == guidance
    fp = FastPipeline.from_pretrained(teacher)
    fp.pipe.set_progress_bar_config(disable=True)
    fp.accelerate(f"student(path={student},steps=1)")
    call = make_inputs(fp.pipe, 50, guidance)  # labels, or the model's prompts, naming digits 0-9 in turn
    labels = [i % 10 for i in range(50)]
    images = fp(**call, output_type="np", generator=torch.Generator().manual_seed(1)).images
    assert fp.context.nfe == 1
    # 50 images: the students' 98.8-100% on 500 leave room for a miss or two, not for a broken install
    assert accuracy(images, labels, load_reference_eval(teacher).classifier) >= 0.9
    with pytest.raises(ValueError, match=f"seed 3 is trained by `.*bash benchmarks/{script}.sh"):
        build(model, tmp_path / "other", size="bench", seed=3)
    weights = next(student.glob("*/diffusion_pytorch_model.safetensors"))
    weights.write_bytes(b"broken")
    with pytest.raises(ShippedModelError, match="diffusion_pytorch_model.safetensors"):
        install(tmp_path / "again", model, source=student)


def test_the_generator_waits_for_the_fake_score_warmup(teacher, tmp_path):
    path, init = teacher
    dmd(path, tmp_path / "w", init=init, train_steps=2, fake_updates=2, fake_warmup=5, **TINY)
    start, after = _weights(init), _weights(tmp_path / "w" / "steps-1")
    assert all(torch.equal(start[k], after[k]) for k in start)  # 2 x 2 fake updates: still warming up
    dmd(path, tmp_path / "m", init=init, train_steps=3, fake_updates=2, fake_warmup=5, **TINY)
    moved = _weights(tmp_path / "m" / "steps-1")
    assert any(not torch.equal(start[k], moved[k]) for k in start)  # the third update moves it


def test_lora_views_share_one_base_and_merge_into_the_generator(flow_teacher):
    from fastdiff.distill.dmd_lora import FAKE, GENERATOR, add_adapters, merged_state_dict

    fp = load_teacher(flow_teacher, allow_flow=True)
    original = fresh_copy(fp.denoiser)
    c, g = original.config, torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(2, c.in_channels, c.sample_size, c.sample_size, generator=g),
        "timestep": torch.tensor([500.0, 200.0]),
        "encoder_hidden_states": torch.randn(2, 4, c.joint_attention_dim, generator=g),
        "pooled_projections": torch.randn(2, c.pooled_projection_dim, generator=g),
    }

    def out(module):
        with torch.no_grad():
            return type(module).forward(module, **inputs, return_dict=False)[0]

    def same(a, b):  # float rounding only: 6e-7 apart on an Intel Xeon's kernels, identical on AMD EPYC
        return torch.allclose(a, b, rtol=0, atol=1e-5)

    base = fp.denoiser
    views = add_adapters(base, rank=4)
    plain = out(original)
    for view in views.values():  # LoRA B starts at zero: every role computes what the teacher does
        assert same(out(view), plain)
    assert not list(views["teacher"].parameters())
    generator = dict(views[GENERATOR].named_parameters())
    assert (
        generator
        and all(f".{GENERATOR}." in n for n in generator)
        and all(p.requires_grad for p in generator.values())
    )
    assert not set(generator) & set(dict(views[FAKE].named_parameters()))
    with torch.no_grad():
        for p in generator.values():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    moved = out(views[GENERATOR])
    assert not torch.allclose(moved, plain)
    assert same(out(views["teacher"]), plain) and same(out(views[FAKE]), plain)  # only the generator moved
    assert all(p.requires_grad for p in generator.values())  # switching adapters keeps every flag
    views[FAKE].requires_grad_(False)
    out(views[FAKE])
    assert not any(p.requires_grad for p in views[FAKE].parameters()) and all(
        p.requires_grad for p in generator.values()
    )
    student = fresh_copy(original)
    student.load_state_dict(merged_state_dict(base, GENERATOR))  # the plain model's keys, every one
    torch.testing.assert_close(out(student), moved, rtol=1e-4, atol=1e-5)


def test_lora_mode_trains_two_adapters_resumes_exactly_and_refuses_what_it_cannot_train(
    teacher, flow_teacher, tmp_path
):
    flow = flow_teacher
    options = dict(guidance=2.0, train_steps=3, lora=4, **TINY)
    whole = dmd(flow, tmp_path / "whole", **options)
    assert whole["train"]["trainable_parameters"] < 0.2 * sum(
        v.numel() for v in load_student(tmp_path / "whole" / "steps-1").denoiser.state_dict().values()
    )
    dmd(flow, tmp_path / "cut", stop_after=2, **options)
    dmd(flow, tmp_path / "cut", resume=True, **options)
    first, second = _weights(tmp_path / "whole" / "steps-1"), _weights(tmp_path / "cut" / "steps-1")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    info = json.loads((tmp_path / "whole" / "steps-1" / MANIFEST).read_text())
    assert info["lora"] == 4
    teacher_weights = load_teacher(flow, allow_flow=True).denoiser.state_dict()
    assert first.keys() == teacher_weights.keys() and any(not torch.equal(first[k], teacher_weights[k]) for k in first)
    path, init = teacher
    with pytest.raises(DistillError, match="--lora needs a teacher that predicts what the one-step generator reads"):
        dmd(path, tmp_path / "eps", lora=4, train_steps=1, **TINY)
    with pytest.raises(DistillError, match="--init and --ema-decay need full mode"):
        dmd(flow, tmp_path / "ema", lora=4, ema_decay=0.9, train_steps=1, **TINY)


def test_the_gan_head_reads_the_fake_scores_middle_features_only_while_capturing():
    from fastdiff.distill.dmd_gan import GanHead, discriminator_loss, generator_loss
    from fastdiff.zoo.tiny import make_pipeline

    unet = make_pipeline("tiny-ddpm").unet
    x = torch.randn(3, unet.config.in_channels, unet.config.sample_size, unet.config.sample_size)
    inputs = {"sample": x, "timestep": torch.tensor([10, 500, 900])}
    head = GanHead(unet, {"sample": x[:1], "timestep": torch.tensor([999])})
    logits, out = head.logits(lambda i: type(unet).forward(unet, **i, return_dict=False)[0], inputs)
    assert logits.shape == (3,) and torch.equal(logits, torch.zeros(3)) and out.shape == x.shape  # starts undecided
    assert discriminator_loss(logits, logits).item() == pytest.approx(2 * np.log(2))
    assert generator_loss(logits).item() == pytest.approx(np.log(2))
    unet(**inputs)  # outside capture(): nothing is recorded
    assert head._features == []
    head.remove()
    assert not unet.mid_block._forward_hooks


def test_the_gan_term_trains_the_head_resumes_exactly_and_needs_training_images(teacher, tmp_path):
    tiny_teacher = teacher
    teacher = build("digits", tmp_path / "digits", size="bench")
    progressive(teacher, tmp_path / "prog", start=2, end=1, steps_per_round=1, batch=2, progress=False)
    init = tmp_path / "prog" / "steps-1"
    options = dict(init=init, guidance=2.0, train_steps=2, gan=1e-2, gan_lr=1e-3, fake_updates=1, **TINY)
    state = _gan_head_after_a_run_that_resumes_exactly(teacher, tmp_path, **options)
    assert state["gan_head"]["readout.weight"].abs().sum() > 0  # the readout left its zero start: it was trained
    groups = state["fake_optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == [TINY.get("fake_lr", 2e-5), 1e-3]  # the head learns at --gan-lr
    path, _ = tiny_teacher
    with pytest.raises(DistillError, match="--gan tells the teacher's training images"):
        dmd(path, tmp_path / "none", init=tiny_teacher[1], gan=1e-2, train_steps=1, **TINY)
    with pytest.raises(DistillError, match="--gan and --gan-d must be >= 0"):
        dmd(teacher, tmp_path / "neg", init=init, gan=-1.0, train_steps=1, **TINY)
    with pytest.raises(DistillError, match="--gan-lr must be > 0, got 0.0"):
        dmd(teacher, tmp_path / "neg", init=init, gan=1e-2, gan_lr=0.0, train_steps=1, **TINY)


def test_the_gan_term_on_a_flow_teacher_reads_its_training_split_in_latent_space(flow_teacher, tmp_path):
    from fastdiff.distill.dmd_gan import GanHead
    from fastdiff.train.data import real_latents, teacher_batches

    fp = load_teacher(flow_teacher, allow_flow=True)
    real = real_latents(fp, flow_teacher)
    batches = teacher_batches(fp, flow_teacher, 2, guidance=1.5, pool=4, steps=2)
    split = np.load(flow_teacher / "eval" / "split.npz")["x_train"]
    assert real.shape == (split.shape[0], *batches.shape) and torch.isfinite(real).all()
    decoded = fp.pipe.vae.decode(real[:2] / fp.pipe.vae.config.scaling_factor + fp.pipe.vae.config.shift_factor)
    assert decoded.sample.shape[1:] == split.shape[1:]  # latents of the split's images, as the pipeline undoes them
    # the head reads the image tokens of the middle joint block (its output is a (text, image) pair)
    _, cond, _ = batches.batch(torch.Generator().manual_seed(0))
    probe = {k: v[:1] if torch.is_tensor(v) else v for k, v in cond.items()}
    probe.update({batches.key: real[:1], "timestep": torch.tensor([500.0])})
    head = GanHead(fp.denoiser, probe)
    denoiser = fp.denoiser
    with head.capture():
        denoiser(**probe)
        tokens = head._features[0]
    image_tokens = (batches.shape[1] // denoiser.config.patch_size) * (batches.shape[2] // denoiser.config.patch_size)
    assert tokens.shape == (1, image_tokens, denoiser.inner_dim)
    head.remove()
    options = dict(guidance=1.5, train_steps=2, gan=1e-2, gan_lr=1e-3, fake_updates=1, **TINY)
    state = _gan_head_after_a_run_that_resumes_exactly(flow_teacher, tmp_path, **options)
    assert state["gan_head"]["readout.weight"].abs().sum() > 0


def test_real_samples_are_read_with_a_pool_prompt_that_names_their_label():
    from fastdiff.distill.dmd_gan import RealSamples

    labels = torch.tensor([0, 1, 2, 1, 0, 2, 2])
    latents = torch.arange(len(labels)).float().view(-1, 1)  # each latent holds its own index
    named = [2, 0, 1, 0, 2, 1]  # the label each pool row's prompt names
    real = RealSamples(latents, labels, named, {"prompt_embeds": torch.arange(6) * 10, "scale": 1.0})
    x, cond = real.draw(200, torch.Generator().manual_seed(0))
    rows = cond["prompt_embeds"] // 10
    assert cond["scale"] == 1.0 and x.shape == (200, 1)
    assert [named[r] for r in rows.tolist()] == labels[x.view(-1).long()].tolist()  # each read with its label's prompt
    assert set(rows.tolist()) == set(range(6))  # every row naming a label gets used
    x_plain, none = RealSamples(latents).draw(5, torch.Generator().manual_seed(0))
    assert none is None and x_plain.shape == (5, 1)  # no labels: read with the unconditional input
    with pytest.raises(DistillError, match=r"no prompt of the training pool names the labels \[2\]"):
        RealSamples(latents, labels, [0, 1], {"prompt_embeds": torch.arange(2)})


def test_gan_prompts_on_a_flow_teacher_reads_training_images_with_their_digits_prompts(
    flow_teacher, teacher, tmp_path
):
    from fastdiff.train.data import prompt_labels, teacher_batches

    fp = load_teacher(flow_teacher, allow_flow=True)
    batches = teacher_batches(fp, flow_teacher, 2, guidance=1.5, pool=12, steps=2)
    assert prompt_labels(fp.pipe, batches.prompts) == [i % 10 for i in range(12)]  # the bench prompts cycle digits
    options = dict(guidance=1.5, train_steps=2, gan=1e-2, gan_lr=1e-3, gan_prompts=True, fake_updates=1, **TINY)
    state = _gan_head_after_a_run_that_resumes_exactly(flow_teacher, tmp_path, **options)
    assert state["gan_head"]["readout.weight"].abs().sum() > 0
    manifest = json.loads((tmp_path / "whole" / "fastdiff_distill.json").read_text())
    assert manifest["command"]["gan_prompts"] is True
    path, init = teacher
    with pytest.raises(DistillError, match="--gan-prompts is for flow teachers"):
        dmd(path, tmp_path / "unet", init=init, gan=1e-2, gan_prompts=True, train_steps=1, **TINY)
    with pytest.raises(DistillError, match="--gan-prompts is an option of the GAN term"):
        dmd(flow_teacher, tmp_path / "nogan", gan_prompts=True, train_steps=1, **TINY)
