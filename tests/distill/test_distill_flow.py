"""Progressive distillation of a flow-matching teacher (an SD3-shaped digits-flow toy): students on the flow
Euler grid the pipeline samples on, saved and loaded like the epsilon/v ones; refusals for what it cannot do."""

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fastdiff import FastPipeline  # noqa: E402
from fastdiff.cli.main import main  # noqa: E402
from fastdiff.distill.common import DistillError, load_student  # noqa: E402
from fastdiff.distill.consistency import consistency  # noqa: E402
from fastdiff.distill.flow import flow_grid  # noqa: E402
from fastdiff.distill.progressive import progressive  # noqa: E402
from fastdiff.zoo import build  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return build("digits-flow", tmp_path_factory.mktemp("digits-flow"), size="test")


def test_grid_is_the_pipelines_own_flow_euler_grid(teacher):
    fp = FastPipeline.from_pretrained(teacher)
    fp.pipe.set_progress_bar_config(disable=True)
    for steps in (2, 4):
        fp(prompt="a seven", num_inference_steps=steps, guidance_scale=1.0, output_type="latent")
        assert torch.equal(flow_grid(fp.pipe.scheduler, steps), torch.as_tensor(fp.pipe.scheduler.sigmas).float())
    grid = flow_grid(fp.pipe.scheduler, 4)
    assert grid.numel() == 5 and grid[0] == 1 and grid[-1] == 0 and bool((grid.diff() < 0).all())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_students_of_a_flow_teacher(teacher, tmp_path):
    out = tmp_path / "prog"
    report = progressive(
        teacher, out, start=4, end=2, steps_per_round=4, batch=2, pool=4, guidance=3.0, progress=False
    )
    assert list(report["rounds"]) == [2] and report["rounds"][2]["steps"] == 4
    info = json.loads((out / "steps-2" / "fastdiff_distill.json").read_text())
    assert info["load_accelerators"] == "scheduler(name=flow-euler,steps=2)" and info["guidance_baked_in"] == 3.0
    assert json.loads((out / "fastdiff_distill.json").read_text())["command"]["pool"] == 4
    student = load_student(out / "steps-2")
    assert type(student.pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    student.pipe.set_progress_bar_config(disable=True)
    images = student(prompt=["a seven", "the digit 3"], output_type="np").images  # 2 steps, guidance baked in
    assert images.shape[0] == 2 and np.isfinite(images).all()
    plain = FastPipeline.from_pretrained(teacher)
    weights = {k: v for k, v in student.denoiser.state_dict().items()}
    changed = [k for k, v in plain.denoiser.state_dict().items() if not torch.equal(v, weights[k])]
    assert changed, "the student's weights moved away from the teacher's"
    with pytest.raises(DistillError, match="--resume"):
        progressive(teacher, out, start=4, end=2, steps_per_round=4, batch=2, pool=4, guidance=3.0)


def test_refusals_on_flow_teachers(teacher, tmp_path, capsys):
    with pytest.raises(DistillError, match="flow-matching model.*distill progressive"):
        consistency(teacher, tmp_path / "lcm", train_steps=1)
    with pytest.raises(DistillError, match="--pool"):
        progressive(teacher, tmp_path / "p", start=4, end=2, batch=8, pool=4)
    with pytest.raises(SystemExit) as cli:  # the command line: exit 2, one line naming the option
        main(
            [
                "distill",
                "progressive",
                str(teacher),
                str(tmp_path / "p"),
                "--from",
                "4",
                "--to",
                "2",
                "--batch",
                "8",
                "--pool",
                "4",
            ]
        )
    assert cli.value.code == 2
    assert "--pool (4) must hold at least one batch (8)" in capsys.readouterr().err
    flux = build("tiny-flux", tmp_path / "flux", size="test")
    with pytest.raises(DistillError, match="use_dynamic_shifting"):
        progressive(flux, tmp_path / "flux-prog", start=4, end=2, batch=2, pool=2, steps_per_round=1)
