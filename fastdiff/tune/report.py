"""The tuner's report: the pick, chosen on the selection seed, measured again on a second (report) seed.

Every search decision (the rungs, the budget checks, the ranking, the pick) is made on the selection seed, so
its figures favour the pick: of many candidates near the budget's edge, the one kept is the one whose sample
happened to fall well. ``report_on`` measures the baseline, the pick and the selection's Pareto frontier once
more, on the full image count and another seed (other initial noise), and judges the budgets there against the
baseline of that seed. Nothing is re-picked on the report seed: a pick that misses a budget there is reported
as missing it.

Example::

    from fastdiff.tune.measure import Measurer
    from fastdiff.tune.budget import parse_budgets
    from fastdiff.tune.report import report_on

    m = Measurer("/tmp/digits", threads=1)
    out = report_on(m, 1, "scheduler(name=dpm++2m,steps=20)", "scheduler(name=unipc,steps=5)", [],
                    parse_budgets(["accuracy>=-1 point"]), images=100, speed="cpu_seconds_median")
    print(out["within_budget"], out["best"]["verdicts"])
"""

from __future__ import annotations

import time
from typing import Any

from fastdiff.tune.budget import Budget

QUALITY = ("accuracy", "fd", "fd_floor", "ode_error", "psnr", "ssim", "denoiser_calls", "within_budget")


def timed_runs(row: dict) -> int | None:
    """How many timed runs a measured row's speed rests on (its ``seconds`` list; a summary keeps ``runs``)."""
    seconds = row.get("seconds")
    return len(seconds) if isinstance(seconds, list) else row.get("runs")


def rate(row: dict, baseline: dict, speed: str) -> None:
    """Set ``row``'s speedup over ``baseline`` and the timed runs it rests on (results records need either a
    ratio's spread or its run count; the tuner times each candidate ``runs`` times, once by default)."""
    row["speedup"] = baseline[speed] / row[speed]
    row["runs"] = timed_runs(row)


def figures(row: dict, speed: str) -> dict:
    """The speed and quality figures of a measured row (``seconds`` is the tuner's speed figure)."""
    out = {
        "runs": timed_runs(row),
        "seconds": row[speed],
        "cpu_seconds": row.get("cpu_seconds_median"),
        "wall_seconds": row.get("seconds_median"),
    }
    return out | {k: row[k] for k in QUALITY if row.get(k) is not None}


def verdicts(row: dict, baseline: dict, budgets: list[Budget]) -> dict[str, dict[str, Any]]:
    """Per budget: whether ``row`` meets it against ``baseline`` (``holds``), its value and the threshold."""
    out = {}
    for budget in budgets:
        failed = "error" in row
        margin = None if failed else budget.margin(row, baseline)
        out[str(budget)] = {
            "holds": margin is not None and margin >= 0,
            "value": None if failed else row.get(budget.metric),  # None for the baseline's own PSNR/SSIM
            "threshold": budget.threshold(baseline),
        }
    return out


def judge(row: dict, baseline: dict, budgets: list[Budget], speed: str) -> dict:
    """``row`` with its speedup over ``baseline`` and whether it is within every budget (in place)."""
    if "error" in row:
        row["within_budget"] = False
        return row
    rate(row, baseline, speed)
    row["within_budget"] = all(b.holds(row, baseline) for b in budgets)
    return row


def summary(row: dict, speed: str) -> dict:
    """A judged row as the result shows it: spec, speedup and figures, or spec and error."""
    if "error" in row:
        return {"spec": row["spec"], "error": row["error"], "within_budget": False}
    return {"spec": row["spec"], "speedup": row["speedup"], **figures(row, speed)}


def report_on(
    measurer,
    seed: int,
    baseline_spec: str,
    pick: str | None,
    frontier: list[dict],
    budgets: list[Budget],
    images: int,
    speed: str,
    deadline: float | None = None,
    step=None,
) -> dict[str, Any]:
    """Measure the baseline, ``pick`` and the ``frontier`` specs on ``seed`` and ``images`` images; judge them.

    The baseline and the pick are always measured; the other frontier specs only before ``deadline`` (a
    ``time.perf_counter`` value; ``complete`` says whether all were). ``step(spec)`` is called before each
    measurement (progress). Returns ``seed``, ``images``, ``baseline``, ``best`` (the pick's figures and
    ``verdicts`` per budget, or None), ``within_budget`` (whether the pick meets every budget on this seed),
    ``frontier`` (in the selection's order), ``complete``, ``counts`` and ``seconds``.
    """
    start, runs, hits = time.perf_counter(), measurer.runs, measurer.hits

    def measure(spec: str, **kwargs) -> dict:
        if step is not None:
            step(spec)
        return measurer.measure(spec, images, seed=seed, **kwargs)

    base = dict(measure(baseline_spec, baseline=True), name="baseline")
    rows = {baseline_spec: base}
    if pick is not None and pick not in rows:
        rows[pick] = measure(pick)
    complete = True
    for spec in (r["spec"] for r in frontier):
        if spec in rows:
            continue
        if deadline is not None and time.perf_counter() > deadline:
            complete = False
            break
        rows[spec] = measure(spec)
    for row in rows.values():
        judge(row, base, budgets, speed)
    best = None
    if pick is not None:
        best = summary(rows[pick], speed) | {"verdicts": verdicts(rows[pick], base, budgets)}
    return {
        "seed": seed,
        "images": images,
        "baseline": {"spec": baseline_spec, **figures(base, speed)},
        "best": best,
        "within_budget": None if best is None else best["within_budget"],
        "frontier": [summary(rows[r["spec"]], speed) for r in frontier if r["spec"] in rows],
        "complete": complete,
        "counts": {"measurements": measurer.runs - runs, "cache_hits": measurer.hits - hits},
        "seconds": time.perf_counter() - start,
    }
