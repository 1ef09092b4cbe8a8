"""fastdiff.train.loop: seeded order, accumulation, checkpoints, resume (also after SIGKILL), loss log."""

from __future__ import annotations

import copy
import csv
import signal

import pytest
import torch

from fastdiff.parallel.launch import start_context
from fastdiff.train.loop import atomic_save, step_generator, train


def _tiny_run(out, steps=8, stop_after=None, announce=None):
    """A test-size UNet trained on its own denoising loss, with gradient accumulation and an EMA copy;
    ``announce``: a queue that gets each finished step (the killed run)."""
    from fastdiff.train.inputs import denoiser_output, noised_inputs
    from fastdiff.zoo.tiny import make_pipeline

    torch.set_num_threads(1)
    torch.manual_seed(0)
    pipe = make_pipeline("tiny-ddpm", "test")
    net, config = pipe.unet, pipe.scheduler.config
    ema = copy.deepcopy(net)
    inputs = {"sample": torch.zeros(2, 3, 32, 32), "timestep": torch.tensor(0)}

    def loss_fn(model, g, device):
        noisy, target = noised_inputs(config, inputs, generator=g)
        return torch.nn.functional.mse_loss(denoiser_output(model, noisy), target)

    def after_step(step):
        with torch.no_grad():
            for e, p in zip(ema.parameters(), net.parameters()):
                e.lerp_(p, 0.5)
        if announce is not None:
            announce.put(step + 1)

    train(
        net,
        loss_fn,
        steps,
        lr=1e-3,
        out_dir=out,
        save_every=1,
        accumulate=2,
        extra={"ema": ema},
        after_step=after_step,
        progress=False,
        stop_after=stop_after,
    )
    torch.save({"net": net.state_dict(), "ema": ema.state_dict()}, f"{out}/final.pt")


@pytest.mark.timeout(180)
def test_sigkill_mid_run_then_resume_gives_the_same_weights(tmp_path):
    # a real process killed with SIGKILL, started as fastdiff's workers are (a fork server that has imported
    # fastdiff: a fresh interpreter would spend ~20 s on imports)
    context = start_context()
    steps = context.Queue()
    killed = context.Process(target=_tiny_run, args=(tmp_path / "a",), kwargs={"announce": steps})
    killed.start()
    while steps.get(timeout=120) != 4:  # between step 4's update and the end of its checkpoint write
        pass
    killed.kill()
    killed.join(60)
    assert killed.exitcode == -signal.SIGKILL, "the run finished before it was killed"
    assert not (tmp_path / "a" / "final.pt").exists()
    state = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    assert 3 <= state["step"] <= 4
    threads = torch.get_num_threads()
    try:
        _tiny_run(tmp_path / "a")  # resume the killed run, then an uninterrupted one for comparison
        _tiny_run(tmp_path / "b")
    finally:
        torch.set_num_threads(threads)
    got = torch.load(tmp_path / "a" / "final.pt")
    want = torch.load(tmp_path / "b" / "final.pt")
    for part in ("net", "ema"):
        for key, value in want[part].items():
            assert torch.equal(got[part][key], value), f"{part}.{key} differs after resume"
    with (tmp_path / "a" / "loss.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert steps == list(range(1, 9))  # rows logged after the last checkpoint were dropped and redone
    assert not list((tmp_path / "a").glob("*.tmp"))


def _regression(steps=6, **kwargs):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    seen = []

    def loss_fn(model, g, device):
        i = torch.randint(0, 64, (8,), generator=g)
        seen.append(i)
        return torch.nn.functional.mse_loss(model(x[i].to(device)), y[i].to(device))

    report = train(net, loss_fn, steps, lr=1e-2, progress=False, **kwargs)
    return net, report, seen


def test_seeded_order_accumulation_and_report(tmp_path):
    a, report, seen_a = _regression(seed=1, accumulate=2)
    b, _, seen_b = _regression(seed=1, accumulate=2)
    _, _, seen_c = _regression(seed=2, accumulate=2)
    assert len(seen_a) == 12 and all(torch.equal(p, q) for p, q in zip(seen_a, seen_b))
    assert not all(torch.equal(p, q) for p, q in zip(seen_a, seen_c))
    assert torch.equal(a.weight, b.weight)
    assert report["steps"] == 6 and report["device"] == "cpu" and report["mixed_precision"] == "no"
    assert report["loss_last"] is not None and report["peak_memory_mib"] > 0
    assert step_generator(0, 1, 0, 2).initial_seed() != step_generator(0, 0, 1, 2).initial_seed()


def test_stop_after_and_resume_match_a_straight_run(tmp_path):
    straight, _, _ = _regression(steps=6, out_dir=tmp_path / "a", save_every=2)
    _, first, _ = _regression(steps=6, out_dir=tmp_path / "b", stop_after=3, save_every=2)
    assert first["steps"] == 3
    resumed, second, _ = _regression(steps=6, out_dir=tmp_path / "b", save_every=2)
    assert second["resumed_from"] == 3 and second["steps"] == 6
    assert torch.equal(straight.weight, resumed.weight) and torch.equal(straight.bias, resumed.bias)
    fresh, third, _ = _regression(steps=6, out_dir=tmp_path / "b", resume=False)
    assert third["resumed_from"] == 0


def test_gradient_checkpointing_is_switched_off_after_training():
    from fastdiff.train.inputs import denoiser_output, noised_inputs
    from fastdiff.zoo.tiny import make_pipeline

    pipe = make_pipeline("tiny-ddpm", "test")
    inputs = {"sample": torch.zeros(1, 3, 32, 32), "timestep": torch.tensor(0)}

    def loss_fn(model, g, device):
        assert model.is_gradient_checkpointing
        noisy, target = noised_inputs(pipe.scheduler.config, inputs, generator=g)
        return torch.nn.functional.mse_loss(denoiser_output(model, noisy), target)

    report = train(pipe.unet, loss_fn, 1, gradient_checkpointing=True, progress=False)
    assert report["steps"] == 1 and not pipe.unet.is_gradient_checkpointing


def test_atomic_save_and_bad_arguments(tmp_path):
    atomic_save(tmp_path / "x" / "c.pt", {"a": 1})
    assert torch.load(tmp_path / "x" / "c.pt")["a"] == 1 and not list((tmp_path / "x").glob("*.tmp"))
    net = torch.nn.Linear(1, 1)
    for bad in ({"steps": -1}, {"lr": 0.0}, {"accumulate": 0}, {"schedule": "linear"}):
        kwargs = {"steps": 1, **bad}
        with pytest.raises(ValueError):
            train(net, lambda m, g, d: m(torch.ones(1, 1)).sum(), progress=False, **kwargs)
