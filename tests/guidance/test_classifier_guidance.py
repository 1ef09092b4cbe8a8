"""classifier-guidance: the gradient raises log p(label), scale 0 is a no-op, eps/v/x0 agree, clear errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, UNet2DModel
from diffusers.models.unets.unet_2d import UNet2DOutput
from helpers import call, tiny_pipe

from fastdiff import AcceleratorError, FastPipeline
from fastdiff.cli.main import main as cli_main
from fastdiff.guidance.classifier import NoiseSchedule
from fastdiff.guidance.noisy_classifier import (
    NoisyClassifier,
    load_noisy_classifier,
    save_noisy_classifier,
    schedule_of,
)
from fastdiff.schedulers.presets import PRESETS
from fastdiff.zoo.pipelines import ClassConditionalPipeline

STEPS = 5


def small_unet(cls=UNet2DModel) -> UNet2DModel:
    torch.manual_seed(0)
    return cls(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        num_class_embeds=11,
        norm_num_groups=8,
    ).eval()


def digits_like(prediction_type: str = "epsilon") -> ClassConditionalPipeline:
    # Betas given explicitly: presets built from_config keep only explicitly set values.
    scheduler = DDIMScheduler(
        beta_start=1e-4, beta_end=0.02, beta_schedule="linear", clip_sample=False, prediction_type=prediction_type
    )
    pipe = ClassConditionalPipeline(unet=small_unet(), scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def save_classifier(path, scheduler_config, in_channels: int = 1, seed: int = 0) -> str:
    torch.manual_seed(seed)
    model = NoisyClassifier(in_channels=in_channels, num_classes=10, widths=(8, 16), groups=4)
    save_noisy_classifier(model, path, {"schedule": schedule_of(scheduler_config)})
    return str(path)


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("clf") / "c.pt", digits_like().scheduler.config)


def run(fp, labels=(3, 7), **kw):
    kw.setdefault("num_inference_steps", STEPS)
    return fp(list(labels), output_type="np", generator=torch.Generator().manual_seed(0), **kw).images


def test_gradient_raises_log_probability_at_fixed_xt(clf):
    fp = FastPipeline(digits_like())
    model, _ = load_noisy_classifier(clf)
    x, t, y = (
        torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(1)),
        600,
        torch.tensor([0, 3, 5, 9]),
    )
    abar = float(fp.pipe.scheduler.alphas_cumprod[t])

    def x0_hat(spec):
        handle = fp.accelerate(spec) if spec else None
        fp.context.active, fp.context.num_steps = True, 1  # a denoiser call as inside fp(...)
        try:
            with torch.no_grad():
                eps = fp.denoiser(x, torch.tensor(t), class_labels=y).sample
        finally:
            fp.context.active = False
            handle and handle.remove()
        return (x - math.sqrt(1 - abar) * eps) / math.sqrt(abar)

    moved = x0_hat(f"classifier-guidance(path={clf},scale=5)") - x0_hat(None)
    assert moved.abs().max() > 0

    def log_p(sample):
        return torch.log_softmax(model(sample, t), 1).gather(1, y[:, None]).squeeze(1)

    with torch.no_grad():  # a small step of x_t along the guidance raises every image's log p(label | x_t)
        assert (log_p(x + 1e-3 * moved / moved.norm()) > log_p(x)).all()


@pytest.mark.parametrize("pipe_name", ["digits", "tiny-sd", "tiny-dit", "tiny-ddpm"])
def test_scale_zero_is_bit_identical(tmp_path, pipe_name):
    pipe = digits_like() if pipe_name == "digits" else tiny_pipe(pipe_name)
    fp = FastPipeline(pipe, accelerators="scheduler(name=ddim)")  # deterministic sampler
    channels = fp.denoiser.config.in_channels
    path = save_classifier(tmp_path / "c.pt", pipe.scheduler.config, in_channels=channels)
    guidance = 1.0 if pipe_name in ("digits", "tiny-ddpm") else 3.0
    before = call(fp, steps=STEPS, guidance=guidance if pipe_name != "tiny-ddpm" else None)
    handle = fp.accelerate(f"classifier-guidance(path={path},scale=0,label=1)")
    same = call(fp, steps=STEPS, guidance=guidance if pipe_name != "tiny-ddpm" else None)
    handle.remove()
    assert np.array_equal(before, same)
    fp.accelerate(f"classifier-guidance(path={path},scale=20,label=1)")  # and a real scale changes the images
    guided = call(fp, steps=STEPS, guidance=guidance if pipe_name != "tiny-ddpm" else None)
    assert np.isfinite(guided).all() and not np.array_equal(before, guided)


class ConvertedUNet(UNet2DModel):
    """The epsilon UNet re-expressed as a v or x0 predictor, exactly (same model, other parametrisation)."""

    def forward(self, sample, timestep, class_labels=None, return_dict=True):
        eps = super().forward(sample, timestep, class_labels=class_labels).sample
        abar = self.alphas_cumprod[int(timestep)]
        x0 = (sample - (1 - abar).sqrt() * eps) / abar.sqrt()
        out = abar.sqrt() * eps - (1 - abar).sqrt() * x0 if self.target == "v_prediction" else x0
        return UNet2DOutput(sample=out) if return_dict else (out,)


@pytest.mark.parametrize("prediction_type", ["v_prediction", "sample"])
def test_v_and_x0_prediction_match_epsilon(clf, prediction_type):
    eps_fp = FastPipeline(digits_like())
    converted = digits_like(prediction_type)
    unet = ConvertedUNet.from_config(converted.unet.config).eval()
    unet.load_state_dict(eps_fp.pipe.unet.state_dict())
    unet.alphas_cumprod, unet.target = converted.scheduler.alphas_cumprod, prediction_type
    converted.unet = unet
    other_fp = FastPipeline(converted)
    assert np.allclose(run(eps_fp), run(other_fp), atol=1e-4)
    spec = f"classifier-guidance(path={clf},scale=30)"
    eps_fp.accelerate(spec)
    other_fp.accelerate(spec)
    guided = run(eps_fp)
    assert np.allclose(guided, run(other_fp), atol=1e-4)
    assert np.abs(guided - run(FastPipeline(digits_like()))).max() > 1e-2


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "lcm" and not p.startswith("flow-")])
def test_every_sampler_preset(clf, preset):
    fp = FastPipeline(digits_like(), accelerators=f"scheduler(name={preset})")
    fp.accelerate(f"classifier-guidance(path={clf},scale=10,unconditional=true)")
    images = run(fp, num_inference_steps=4)
    assert images.shape == (2, 16, 16, 1) and np.isfinite(images).all()


def test_fractional_timesteps_interpolate_alpha_bar():
    config = DDIMScheduler().config
    schedule, alphas = NoiseSchedule(config), DDIMScheduler().alphas_cumprod
    assert math.isclose(schedule.alpha_bar(400), float(alphas[400]), rel_tol=1e-6)
    assert float(alphas[401]) < schedule.alpha_bar(400.5) < float(alphas[400])


class LabelSpy:
    """Records the class labels that reach the UNet's class embedding and the classifier's batch sizes."""

    def __init__(self, fp, classifier):
        self.labels, self.rows = [], []
        fp.denoiser.class_embedding.register_forward_hook(lambda m, a, o: self.labels.append(a[0].tolist()))
        classifier.register_forward_hook(lambda m, a, o: self.rows.append(a[0].shape[0]))


def classifier_of(fp):
    return fp.denoiser._diffusers_hook.hooks[
        next(n for n in fp.denoiser._diffusers_hook._hook_order if n.startswith("fastdiff.classifier-guidance"))
    ].hook.classifier


def test_unconditional_runs_null_class_and_cfg_takes_one_gradient(clf):
    fp = FastPipeline(digits_like())
    fp.accelerate(f"classifier-guidance(path={clf},scale=2,unconditional=true,start=0.4)")
    spy = LabelSpy(fp, classifier_of(fp))
    run(fp)
    assert all(labels == [10, 10] for labels in spy.labels)  # the denoiser is the unconditional model
    assert len(spy.rows) == STEPS - 2  # window: progress 0.4, 0.6, 0.8 of 5 steps
    fp.remove_all()
    fp.accelerate(f"classifier-guidance(path={clf},scale=2)")
    spy = LabelSpy(fp, classifier_of(fp))
    run(fp, guidance_scale=3.0)  # with classifier-free guidance: one gradient per image, not per branch
    assert spy.labels[0] == [10, 10, 3, 7] and spy.rows == [2] * STEPS


def test_bad_path_label_and_model_give_clear_errors(tmp_path, clf):
    fp = FastPipeline(digits_like())
    with pytest.raises(AcceleratorError, match="no noise-aware classifier at .*train-classifier"):
        fp.accelerate(f"classifier-guidance(path={tmp_path}/missing.pt)")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(AcceleratorError, match="not a readable classifier file"):
        fp.accelerate(f"classifier-guidance(path={tmp_path}/junk.pt)")
    with pytest.raises(AcceleratorError, match=r"label 10 is not a class .*0\.\.9"):
        fp.accelerate(f"classifier-guidance(path={clf},label=10)")
    with pytest.raises(AcceleratorError, match="label must be an integer >= 0 or none"):
        fp.accelerate(f"classifier-guidance(path={clf},label=-1)")
    with pytest.raises(AcceleratorError, match="scale must be"):
        fp.accelerate(f"classifier-guidance(path={clf},scale=-1)")
    with pytest.raises(AcceleratorError, match="start .* must be <= end"):
        fp.accelerate(f"classifier-guidance(path={clf},start=0.8,end=0.2)")
    ddpm = FastPipeline(tiny_pipe("tiny-ddpm"))
    wrong = save_classifier(tmp_path / "c3.pt", ddpm.pipe.scheduler.config, in_channels=3)
    with pytest.raises(AcceleratorError, match="takes no class labels; give label=N"):
        ddpm.accelerate(f"classifier-guidance(path={wrong})")
    with pytest.raises(AcceleratorError, match="needs a class-conditional pipeline with a null class"):
        ddpm.accelerate(f"classifier-guidance(path={wrong},label=1,unconditional=true)")
    with pytest.raises(AcceleratorError, match="takes 1 channels, the UNet2DModel 3"):
        ddpm.accelerate(f"classifier-guidance(path={clf},label=1)")
    other = save_classifier(tmp_path / "c4.pt", DDIMScheduler(beta_schedule="scaled_linear").config)
    with pytest.raises(AcceleratorError, match="trained for noise schedule"):
        fp.accelerate(f"classifier-guidance(path={other})")
    assert not fp.accelerators


def test_train_classifier_command(tmp_path, capsys):
    pipe = digits_like()
    pipe.save_pretrained(tmp_path / "model")
    rng = np.random.default_rng(0)
    (tmp_path / "model" / "eval").mkdir()
    np.savez(
        tmp_path / "model" / "eval" / "split.npz",
        x_train=rng.random((40, 1, 16, 16), dtype=np.float32),
        y_train=np.arange(40) % 10,
        x_test=rng.random((20, 1, 16, 16), dtype=np.float32),
        y_test=np.arange(20) % 10,
    )
    out = tmp_path / "clf.pt"
    cli_main(
        [
            "train-classifier",
            str(tmp_path / "model"),
            str(out),
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--widths",
            "8",
            "16",
        ]
    )
    model, report = load_noisy_classifier(out)
    assert report["steps"] == 3 and set(report["test_accuracy_by_t"]) >= {"0", "500", "999"}
    assert json.loads((tmp_path / "clf.pt.json").read_text())["model"] == str(tmp_path / "model")
    assert "classifier-guidance(path=" in capsys.readouterr().out
    fp = FastPipeline(pipe)
    fp.accelerate(f"classifier-guidance(path={out},scale=1,unconditional=true)")
    assert np.isfinite(run(fp)).all()
    with pytest.raises(SystemExit, match="no training data at"):
        cli_main(["train-classifier", str(tmp_path / "model"), str(out), "--data", str(tmp_path / "none.npz")])
