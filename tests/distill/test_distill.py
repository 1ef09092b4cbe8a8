"""fastdiff distill: progressive and consistency (full, LoRA) students load and sample; bad input; lcm-lora."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.cli.main import main
from fastdiff.distill.common import MANIFEST, load_student
from fastdiff.zoo import build

FAST = ["--batch", "2", "--save-every", "1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    return {name: build(name, root / name, size="test") for name in ("tiny-ddpm", "tiny-sd", "tiny-dit")}


def _sample(fp, **kwargs):
    fp.pipe.set_progress_bar_config(disable=True)
    out = fp(output_type="np", generator=torch.Generator().manual_seed(0), **kwargs)
    assert np.isfinite(out.images).all()
    return out.images


def test_progressive_rounds_load_and_sample_in_their_step_count(models, tmp_path):
    out = tmp_path / "prog"
    main(
        [
            "distill",
            "progressive",
            str(models["tiny-ddpm"]),
            str(out),
            "--from",
            "4",
            "--to",
            "1",
            "--steps-per-round",
            "2",
            *FAST,
        ]
    )
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["steps-1", "steps-2"]
    for n in (2, 1):
        fp = load_student(out / f"steps-{n}")
        config = fp.pipe.scheduler.config
        assert config.prediction_type == "v_prediction" and config.timestep_spacing == "trailing"
        _sample(fp, batch_size=2)
        assert fp.context.nfe == n
        assert (out / f"steps-{n}" / "loss.csv").is_file()
        plain = FastPipeline.from_pretrained(out / f"steps-{n}")  # no argument: the recorded step count
        plain.set_progress_bar_config(disable=True)
        plain(batch_size=1, output_type="np")
        assert plain.context.nfe == n
    assert json.loads((out / MANIFEST).read_text())["done"]
    with pytest.raises(SystemExit, match="--resume"):  # an earlier run of the same command: only with --resume
        main(
            [
                "distill",
                "progressive",
                str(models["tiny-ddpm"]),
                str(out),
                "--from",
                "4",
                "--to",
                "1",
                "--steps-per-round",
                "2",
                *FAST,
            ]
        )
    main(
        [
            "distill",
            "progressive",
            str(models["tiny-ddpm"]),
            str(out),
            "--from",
            "4",
            "--to",
            "1",
            "--steps-per-round",
            "2",
            *FAST,
            "--resume",
        ]
    )


def test_progressive_on_the_digits_reference_bakes_guidance_in(tmp_path):
    teacher = build("digits", tmp_path / "digits", size="bench")
    main(
        [
            "distill",
            "progressive",
            str(teacher),
            str(tmp_path / "prog"),
            "--from",
            "2",
            "--to",
            "1",
            "--steps-per-round",
            "1",
            "--guidance",
            "2",
            *FAST,
        ]
    )
    student = tmp_path / "prog" / "steps-1"
    assert (student / "eval").is_dir()  # bench scores it with the reference's classifier
    info = json.loads((student / MANIFEST).read_text())
    assert info["guidance_baked_in"] == 2.0 and info["sample_with"]["guidance_scale"] == 1.0
    fp = load_student(student)
    assert _sample(fp, class_labels=[3, 7], guidance_scale=1.0).shape[0] == 2 and fp.context.nfe == 1


def test_consistency_full_student_with_w_embedding(models, tmp_path):
    out = tmp_path / "lcm"
    main(
        [
            "distill",
            "consistency",
            str(models["tiny-sd"]),
            str(out),
            "--guidance-range",
            "2,4",
            "--train-steps",
            "2",
            "--skip",
            "100",
            *FAST,
        ]
    )
    fp = load_student(out)
    assert fp.denoiser.config.time_cond_proj_dim == 256
    assert type(fp.pipe.scheduler).__name__ == "LCMScheduler"
    assert fp.pipe.scheduler.config.original_inference_steps == 10
    _sample(fp, prompt=["a red circle"], guidance_scale=3.0)
    assert fp.context.nfe == 4  # one batch per step: the guidance is in the embedding


def test_consistency_lora_and_lcm_lora_apply_remove_bit_identical(models, tmp_path):
    out = tmp_path / "lora"
    main(["distill", "consistency", str(models["tiny-ddpm"]), str(out), "--lora", "2", "--train-steps", "2", *FAST])
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "model_index.json").exists()
    fp = FastPipeline.from_pretrained(models["tiny-ddpm"])
    kwargs = {"batch_size": 2, "num_inference_steps": 3}
    before = _sample(fp, **kwargs)
    params = sum(p.numel() for p in fp.denoiser.parameters())
    handle = fp.accelerate(f"lcm-lora(path={out})")
    lora = sum(p.numel() for n, p in fp.denoiser.named_parameters() if "lora_" in n)
    assert 0 < lora < 0.1 * params
    _sample(fp, batch_size=2)
    assert fp.context.nfe == 4 and type(fp.pipe.scheduler).__name__ == "LCMScheduler"
    with pytest.raises(AcceleratorError, match="conflicts"):
        fp.accelerate("scheduler(name=ddim,steps=4)")
    handle.remove()
    assert np.array_equal(_sample(fp, **kwargs), before)
    assert not any("lora_" in n for n, _ in fp.denoiser.named_parameters())
    with pytest.raises(AcceleratorError, match="adapter"):
        fp.accelerate(f"lcm-lora(path={tmp_path})")
    other = FastPipeline.from_pretrained(models["tiny-sd"])  # an adapter of another model does not fit
    with pytest.raises(AcceleratorError):
        other.accelerate(f"lcm-lora(path={out})")
    assert not any("lora_" in n for n, _ in other.denoiser.named_parameters())


def test_bad_input_is_refused_and_writes_nothing(models, tmp_path):
    ddpm = str(models["tiny-ddpm"])
    cases = [
        (["progressive", str(models["tiny-dit"]), "OUT"], "UNet2DModel or UNet2DConditionModel"),
        (["progressive", str(tmp_path), "OUT"], "model_index.json"),
        (["progressive", ddpm, "OUT", "--from", "6"], "power of two"),
        (["progressive", ddpm, "OUT", "--from", "2", "--to", "4"], "above"),
        (["progressive", ddpm, "OUT", "--from", "4", "--to", "3"], "power of two"),
        (["consistency", ddpm, "OUT", "--guidance-range", "1,3"], "w-embedding"),
        (["consistency", ddpm, "OUT", "--guidance-range", "3,2"], "guidance range"),
        (["consistency", ddpm, "OUT", "--skip", "0"], "--skip"),
        (["consistency", ddpm, "OUT", "--lora", "0"], "RANK"),
    ]
    for args, message in cases:
        args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
        with pytest.raises(SystemExit, match=message):
            main(["distill", *args, *FAST])
        assert not (tmp_path / "out").exists(), args
    other = tmp_path / "taken"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for resume in ([], ["--resume"]):
        with pytest.raises(SystemExit, match="not an earlier run"):
            main(["distill", "progressive", ddpm, str(other), "--from", "2", *FAST, *resume])
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_student_accelerator_swaps_weights_and_sampler_and_runs_one_batch(tmp_path):
    """student(path=) on the teacher equals loading the student; baked guidance: one batch; remove(): teacher."""
    teacher = build("digits", tmp_path / "digits", size="bench")
    main(
        [
            "distill",
            "progressive",
            str(teacher),
            str(tmp_path / "prog"),
            "--from",
            "4",
            "--to",
            "2",
            "--steps-per-round",
            "1",
            "--guidance",
            "2",
            *FAST,
        ]
    )
    student = tmp_path / "prog" / "steps-2"
    wanted = _sample(load_student(student), class_labels=[3, 7], guidance_scale=1.0)
    fp = FastPipeline.from_pretrained(teacher)
    before = _sample(fp, class_labels=[3, 7], num_inference_steps=3, guidance_scale=2.0)
    batches = []
    probe = fp.denoiser.conv_in.register_forward_pre_hook(lambda m, a: batches.append(a[0].shape[0]))
    handle = fp.accelerate(f"student(path={student})")
    for guidance in (2.0, 1.0):  # the student bakes guidance 2 in: any scale gives what it learned
        np.testing.assert_array_equal(_sample(fp, class_labels=[3, 7], guidance_scale=guidance), wanted)
    assert fp.context.nfe == 2 and set(batches) == {2}  # two steps, each one batch of two images
    with pytest.raises(AcceleratorError, match="conflict"):
        fp.accelerate("scheduler(name=ddim,steps=4)")
    handle.remove()
    probe.remove()
    np.testing.assert_array_equal(_sample(fp, class_labels=[3, 7], num_inference_steps=3, guidance_scale=2.0), before)
    assert type(fp.pipe.scheduler).__name__ != "DDIMScheduler" or fp.pipe.scheduler.config.prediction_type != (
        "v_prediction"
    )
    for bad, message in (
        (tmp_path, "not a student"),
        (tmp_path / "prog", "not a student"),
        (tmp_path / "missing", "not a student"),
    ):
        with pytest.raises(AcceleratorError, match=message):
            fp.accelerate(f"student(path={bad})")
    other = FastPipeline.from_pretrained(build("tiny-ddpm", tmp_path / "ddpm", size="test"))
    with pytest.raises(AcceleratorError, match="UNet2DModel|does not fit"):
        other.accelerate(f"student(path={student})")
    assert not other.accelerators
    np.testing.assert_array_equal(_sample(fp, class_labels=[3, 7], num_inference_steps=3, guidance_scale=2.0), before)


def test_dpm_solver_step_is_closer_to_the_teacher_ode_than_ddim(tmp_path):
    """The consistency target's DPM-Solver++(2S) step t -> s beats one DDIM step against a fine DDIM solve."""
    from fastdiff.distill.common import alphas, to_eps_x0
    from fastdiff.distill.consistency import SOLVERS
    from fastdiff.train.inputs import denoiser_output

    fp = FastPipeline.from_pretrained(build("digits", tmp_path / "digits", size="bench"))
    a_all = alphas(fp.pipe.scheduler.config)
    labels = torch.arange(8) % 10

    def model(x, u, a_u):
        out = denoiser_output(fp.denoiser, {"sample": x, "timestep": u, "class_labels": labels})
        return to_eps_x0(out, x, a_u, fp.pipe.scheduler.config.prediction_type)

    def at(u):
        return a_all[u].view(-1, 1, 1, 1)

    g = torch.Generator().manual_seed(0)
    t0, s0 = 699, 299
    z = at(torch.tensor([t0])).sqrt() * 0 + (1 - at(torch.tensor([t0]))).sqrt() * torch.randn(
        8, 1, 16, 16, generator=g
    )
    t, s = torch.full((8,), t0), torch.full((8,), s0)
    with torch.no_grad():
        fine, grid = z, list(range(t0, s0, -4)) + [s0]
        for u, v in zip(grid[:-1], grid[1:]):
            uu, vv = torch.full((8,), u), torch.full((8,), v)
            fine = SOLVERS["ddim"](a_all)(fine, uu, vv, at(uu), at(vv), model)
        errors = {
            name: (solve(a_all)(z, t, s, at(t), at(s), model) - fine).norm().item() for name, solve in SOLVERS.items()
        }
        near = torch.full((8,), t0 - 1)  # no timestep strictly between: the DPM step is a DDIM step
        same = [solve(a_all)(z, t, near, at(t), at(near), model) for solve in SOLVERS.values()]
    assert errors["dpm"] < 0.5 * errors["ddim"], errors  # measured: 0.34x (digits, 699 -> 299)
    torch.testing.assert_close(same[0], same[1])


def test_consistency_run_with_a_guidance_range_resumes(models, tmp_path):
    """The manifest stores the guidance range as a list; an earlier run of the same command is recognised."""
    out = tmp_path / "lcm"
    args = [
        "distill",
        "consistency",
        str(models["tiny-sd"]),
        str(out),
        "--guidance-range",
        "2",
        "--train-steps",
        "2",
        "--skip",
        "100",
        *FAST,
    ]
    main(args)
    with pytest.raises(SystemExit, match="--resume"):
        main(args)
    main([*args, "--resume"])  # finished: nothing to do
    assert json.loads((out / MANIFEST).read_text())["done"]


def test_baked_guidance_student_refuses_direct_calls_of_the_wrapped_pipe(tmp_path):
    """fp.pipe(...) would guide the guided student again: a loud error instead of a wrong image."""
    teacher = build("digits", tmp_path / "digits", size="bench")
    main(
        [
            "distill",
            "progressive",
            str(teacher),
            str(tmp_path / "prog"),
            "--from",
            "2",
            "--to",
            "1",
            "--steps-per-round",
            "1",
            "--guidance",
            "2",
            *FAST,
        ]
    )
    fp = FastPipeline.from_pretrained(teacher)
    handle = fp.accelerate(f"student(path={tmp_path / 'prog' / 'steps-1'})")
    with pytest.raises(RuntimeError, match="call the FastPipeline"):
        fp.pipe(class_labels=[3], num_inference_steps=1, guidance_scale=2.0, output_type="np")
    _sample(fp, class_labels=[3], guidance_scale=2.0)  # through the wrapper it works
    handle.remove()
    fp.pipe(class_labels=[3], num_inference_steps=1, output_type="np")  # and directly again after remove()
    from fastdiff.core.hooks import base_names

    assert not [n for n in base_names(fp.denoiser) if "student" in n]
    fp.unwrap()
    assert getattr(fp.denoiser, "_diffusers_hook", None) is None and "forward" not in fp.denoiser.__dict__
