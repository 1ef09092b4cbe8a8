"""Pick a training run's checkpoint on selection seeds and report it on others.

A run keeps a snapshot of the student's weights every ``every`` steps (``snapshotter``). ``pick_snapshot``
samples each snapshot on the selection seeds with the teacher's quality evaluator (accuracy and FD on the
digits references) and keeps the one with the lowest FD among those within ``points`` accuracy points of the
best; the pick is then measured on disjoint report seeds (``fastdiff.eval.select``). A teacher without an
evaluator keeps the last snapshot and says so.

Example::

    record = pick_snapshot("/tmp/digits", sorted(Path("/tmp/dmd/train/snapshots").glob("*.safetensors")),
                           scheduler, selection_seeds=[0], report_seeds=[1], images=500)
    record["choice"], record["report"]
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

SNAPSHOTS = "snapshots"


def snapshotter(folder: Path, every: int, module: torch.nn.Module) -> Callable[[int], None]:
    """An ``after_step`` that saves ``module``'s weights as ``folder/step-N.safetensors`` every ``every`` steps;
    the starting weights are saved first as ``step-000000`` (a candidate too: training that makes the student
    worse on the selection seeds is not picked)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)

    def write(name: str) -> None:
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        save_file(state, folder / f"{name}.tmp")
        (folder / f"{name}.tmp").replace(folder / f"{name}.safetensors")

    if not (folder / "step-000000.safetensors").is_file():
        write("step-000000")

    def save(step: int) -> None:
        if (step + 1) % every == 0:
            write(f"step-{step + 1:06d}")

    return save


def within_points_of_best(points: float) -> Callable[[dict], str]:
    """The rule: the lowest mean FD among candidates whose mean accuracy is within ``points`` of the best."""

    def rule(rows_by_value: dict) -> str:
        acc = {v: statistics.fmean(r["accuracy"] for r in rows) for v, rows in rows_by_value.items()}
        best = max(acc.values())
        pool = [v for v in rows_by_value if acc[v] >= best - points / 100]
        return min(pool, key=lambda v: statistics.fmean(r["fd"] for r in rows_by_value[v]))

    rule.description = f"lowest mean FD among snapshots within {points:g} accuracy points of the best"  # type: ignore[attr-defined]
    return rule


def pick_snapshot(
    teacher_dir,
    snapshots: Sequence[Path],
    scheduler,
    selection_seeds: Sequence[int] = (0,),
    report_seeds: Sequence[int] = (1,),
    images: int = 500,
    points: float = 1.0,
    progress: bool = True,
) -> dict:
    """Score every snapshot (one-call samples of ``images`` images, guidance baked in) on the selection seeds,
    pick by ``within_points_of_best(points)``, report the pick on ``report_seeds``."""
    from safetensors.torch import load_file
    from tqdm.auto import tqdm

    from fastdiff.core.pipeline import FastPipeline
    from fastdiff.core.tensors import pixels
    from fastdiff.eval import quality_for
    from fastdiff.eval.bench import make_inputs
    from fastdiff.eval.select import select_then_report

    if not snapshots:
        raise ValueError("no snapshots to pick from")
    fp = FastPipeline.from_pretrained(teacher_dir)
    fp.pipe.set_progress_bar_config(disable=True)
    evaluator = quality_for(fp.pipe)
    names = [Path(s).stem for s in snapshots]
    if evaluator is None:
        return {
            "choice": names[-1],
            "rule": f"last snapshot ({type(fp.pipe).__name__} has no quality evaluator)",
        }
    fp.pipe.scheduler = scheduler
    call = dict(make_inputs(fp.pipe, images, 1.0), output_type="np", num_inference_steps=1)
    by_name = dict(zip(names, snapshots))
    bar = tqdm(total=len(names) * len(selection_seeds) + len(report_seeds), desc="pick", disable=not progress)

    def evaluate(name: str, seed: int) -> dict:
        with torch.no_grad():
            fp.denoiser.load_state_dict(load_file(by_name[name]))
        out = fp(**call, generator=torch.Generator().manual_seed(seed))
        row = {"snapshot": name, "seed": seed, **evaluator(fp.pipe, call, np.asarray(pixels(out)), seed)}
        bar.update()
        return row

    try:
        record = select_then_report(evaluate, names, selection_seeds, report_seeds, within_points_of_best(points))
    finally:
        bar.close()
    record["path"] = str(by_name[record["choice"]])
    return record
