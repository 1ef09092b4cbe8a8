"""fastdiff on torch-xla's CPU backend: outputs vs CPU eager, compile counts after warm-up, refusals.

Run by ``make test-xla`` (it makes ``.venv-xla``: torch 2.9.0 + torch-xla 2.9.0, which cannot live beside the
project's torch 2.13)::

    PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -m xla tests/xla/test_xla.py

In the normal ``.venv`` there is no torch-xla and the whole module is skipped.

- Tolerance: the largest pixel difference (pixels in [0, 1]) from the same call in CPU eager mode is at most
  ``TOLERANCE`` = 5e-4 (measured: 2.5e-6 on tiny-sd; 1e-6 to 3e-5 on digits, 1.2e-4 with pndm, whose 4th-order
  multistep amplifies rounding).
- Compile counts: XLA compiles a graph per distinct step form (the first steps of a multistep sampler, the
  steady step, the last step) and none once the steady step repeats; a second call compiles nothing. The
  step count is part of the shape (the timesteps' length): a new one adds at most ``NEW_STEP_COUNT_GRAPHS``.
- Bound: a deepcache(interval=3) call on digits compiles at most ``DEEPCACHE_MAX_GRAPHS`` = 10 graphs
  (measured: 9 at 12 steps; the same sampler without deepcache: 8), then none for the same shape.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

# XLA's CPU backend compiles 2-3x faster without LLVM optimizations (and runs slower): these tests check
# numbers and graph counts, not speed. Set before torch_xla is imported (its import fills XLA_FLAGS in).
if importlib.util.find_spec("torch_xla") and "optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
pytest.importorskip("torch_xla", reason="torch-xla lives in .venv-xla (make test-xla)")
import torch_xla.backends  # noqa: E402

# A TPU multiplies fp32 through bf16 passes by default; the comparisons with CPU eager need full precision.
torch_xla.backends.set_mat_mul_precision("highest")

from fastdiff.cli.tpu_infer import call_inputs, load, tpu_infer  # noqa: E402
from fastdiff.core.registry import REGISTRY, AcceleratorError, available  # noqa: E402
from fastdiff.core.spec import parse  # noqa: E402
from fastdiff.schedulers.presets import NOT_ON_XLA, PRESETS  # noqa: E402
from fastdiff.xla.metrics import since, snapshot  # noqa: E402
from fastdiff.zoo import build  # noqa: E402
from fastdiff.zoo.shipped import ensure_digits  # noqa: E402

pytestmark = [pytest.mark.xla, pytest.mark.timeout(600)]

TOLERANCE = 5e-4  # an eighth of one 8-bit level (1/255); an XLA bug shows as 1e-2 or more
DEEPCACHE_MAX_GRAPHS = 10
NEW_STEP_COUNT_GRAPHS = 4  # measured 3 on digits (with and without deepcache), 0 on tiny-sd
SAMPLER = "scheduler(name=dpm++2m,steps=6)"
DIGITS_GUIDANCE = 2.0  # guidance on, so that cfg-interval has a branch to drop

# Specs of every accelerator declared runs_on_xla (besides the scheduler presets), and the model each runs on.
RUNNERS = (
    ("cfg-interval(start=0.0,end=0.5)", "digits"),
    ("deepcache(interval=3)", "digits"),
    ("forecast(order=1,interval=2)", "digits"),
    ("tome(ratio=0.5,max_downsample=2)", "digits"),
    ("attention(backend=sdpa)", "digits"),
    ("attention(backend=math)", "digits"),
    ("fuse", "digits"),
    ("sparsity", "digits"),
    ("lowrank(energy=0.9)", "digits"),
    ("prune(ratio=0.25)", "digits"),
    ("promptcache", "tiny-sd"),
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("xla")
    return {
        "tiny-sd": build("tiny-sd", root / "tiny-sd", size="test"),
        "digits": ensure_digits(root / "digits"),
    }


def generate(fp, steps=None, on_step=None):
    """The images of one seeded call (2 prompts or labels); ``on_step(i)`` runs after each step."""
    import torch

    guidance = DIGITS_GUIDANCE if type(fp.pipe).__name__ == "ClassConditionalPipeline" else None
    call = call_inputs(fp, 2, steps, guidance)
    if on_step is not None:
        call["callback_on_step_end"] = lambda pipe, i, t, tensors: on_step(i) or tensors
    return fp(**call, output_type="np", generator=torch.Generator().manual_seed(0)).images


def traced(fp, steps=None):
    """(images, compiles after each step, compiles of the whole call)."""
    before, per_step = snapshot(), []
    images = generate(fp, steps, on_step=lambda i: per_step.append(since(before)["compiles"]))
    return images, per_step, since(before)["compiles"]


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def check_runs(models, model, specs):
    """``specs`` on XLA: output within TOLERANCE of CPU eager; a second call compiles nothing."""
    reference = generate(load(models[model], specs, "cpu"))
    fp = load(models[model], specs, "xla")
    first, _, first_compiles = traced(fp)
    second, _, second_compiles = traced(fp)
    assert fp.pipe.device.type == "xla" and fp.denoiser.device.type == "xla"
    assert max_diff(first, reference) <= TOLERANCE, f"{specs}: {max_diff(first, reference)}"
    assert max_diff(second, reference) <= TOLERANCE
    if "promptcache" in specs:  # its first hit (second call) skips the text encoder: one new program
        second_compiles = traced(fp)[2]
    assert second_compiles == 0, (first_compiles, second_compiles)


@pytest.fixture(scope="module")
def sd_trace(models):
    """tiny-sd (test size, guidance 7.5) with dpm++2m 6 steps in CPU eager and on XLA: images and compile counts."""
    reference = generate(load(models["tiny-sd"], SAMPLER, "cpu"))
    fp = load(models["tiny-sd"], SAMPLER, "xla")
    first = traced(fp)
    return {"fp": fp, "reference": reference, "first": first, "second": traced(fp), "longer": traced(fp, 9)}


def test_tiny_sd_on_xla_matches_cpu_eager(sd_trace):
    fp = sd_trace["fp"]
    assert {p.device.type for p in fp.denoiser.parameters()} == {"xla"}
    assert max_diff(sd_trace["first"][0], sd_trace["reference"]) <= TOLERANCE
    assert max_diff(sd_trace["second"][0], sd_trace["reference"]) <= TOLERANCE


def test_compile_count_stops_growing_after_warmup(sd_trace):
    images, per_step, total = sd_trace["first"]
    assert len(per_step) == 6 and total > 0
    steady = np.diff(per_step)[1:-1]  # steps 2..4: the multistep sampler's steady step, compiled at step 1
    assert (steady == 0).all(), per_step
    assert sd_trace["second"][2] == 0, "a repeated call compiled new graphs"
    assert sd_trace["second"][1] == [0] * 6
    assert sd_trace["longer"][2] <= NEW_STEP_COUNT_GRAPHS


def test_digits_on_xla_matches_cpu_eager(models):
    check_runs(models, "digits", SAMPLER)


def test_deepcache_compiles_a_bounded_number_of_graphs(models):
    deepcache = "deepcache(interval=3)"
    reference = generate(load(models["digits"], f"{SAMPLER};{deepcache}", "cpu"), steps=12)
    fp = load(models["digits"], SAMPLER, "xla")
    plain = generate(fp, steps=12)
    handle = fp.accelerate(deepcache)
    images, per_step, total = traced(fp, 12)
    assert max_diff(images, reference) <= TOLERANCE
    assert 0 < total <= DEEPCACHE_MAX_GRAPHS, per_step
    assert traced(fp, 12)[2] == 0
    # another step count is another shape (the timesteps' length): a few small graphs, as without deepcache
    assert traced(fp, 9)[2] <= NEW_STEP_COUNT_GRAPHS
    assert traced(fp, 9)[2] == 0
    handle.remove()
    assert np.array_equal(generate(fp, steps=12), plain)  # removed on XLA: the sampler's own images again


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in NOT_ON_XLA and not n.startswith("flow-")])
def test_scheduler_presets_run_on_xla(models, name):
    check_runs(models, "digits", f"scheduler(name={name},steps=4)")


@pytest.mark.parametrize("specs, model", RUNNERS, ids=[s for s, _ in RUNNERS])
def test_declared_accelerators_run_on_xla(models, specs, model):
    check_runs(models, model, f"scheduler(name=dpm++2m,steps=4);{specs}")


def test_every_declared_runner_is_checked():
    available()
    declared = {n for n, cls in REGISTRY.items() if cls.runs_on_xla is True}
    assert declared == {parse(s)[0].spec_name for s, _ in RUNNERS}, "declare runs_on_xla with a check in RUNNERS"
    assert REGISTRY["scheduler"](name="dpm++2m").runs_on_xla
    assert not REGISTRY["scheduler"](name="dpm++sde").runs_on_xla


def test_refused_accelerators_name_themselves_and_the_runners(models):
    fp = load(models["digits"], "deepcache(interval=3)", "xla")
    before = fp.accelerators
    for specs in ("compile", "scheduler(name=dpm++sde,steps=4)"):
        with pytest.raises(AcceleratorError, match=r"cannot run on the XLA device") as error:
            fp.accelerate(specs)
        message = str(error.value)
        assert specs.split("(")[0] in message.split("cannot")[0]
        assert all(n in message for n in ("cfg-interval", "deepcache", "scheduler", "prune"))
        assert fp.accelerators == before
    cpu = load(models["digits"], "compile", "cpu")
    with pytest.raises(AcceleratorError, match=r"compile.*cannot run on the XLA device"):
        cpu.to("xla")
    assert cpu.pipe.device.type == "cpu"


def test_tpu_infer_driver_reports_metrics(models, capsys):
    from argparse import Namespace

    from fastdiff.cli.tpu import run

    args = Namespace(
        model=str(models["digits"]),
        size="test",
        accel=SAMPLER,
        batch=2,
        steps=None,
        guidance=None,
        bf16=False,
        warmup=1,
        runs=2,
        seed=0,
        device="xla",
        out=None,
    )
    result = run(args)
    printed = capsys.readouterr().out
    assert "s/image" in printed and "compiles" in printed and "executions" in printed
    assert result["timed"]["compiles"] == 0 and result["timed"]["executions"] > 0
    assert result["warmup"]["executions"] > 0 and len(result["seconds"]) == 2
    eager = tpu_infer(models["digits"], SAMPLER, batch=2, device="cpu", runs=1)
    assert max_diff(result["images"], eager["images"]) <= TOLERANCE
