"""The tuner: the fastest setting within a quality budget, and the speed/quality Pareto frontier.

``tune(model, budgets)`` enumerates a search space (``fastdiff.tune.space``; the model family's default unless
given), prunes declared conflicts, measures the baseline and the candidates with ``fastdiff bench``'s code
(``fastdiff.tune.measure``) and returns a JSON-able dict. Small spaces (at most ``settings.grid_max``
candidates) are measured in full (grid). Larger ones go through successive halving: every candidate on few
images, then the best ``1/eta`` (those plausibly within budget first, by speed; then the nearest misses) on more
images, up to the full measurement, where the budget is judged without slack; if none of the survivors holds
there, the next plausible candidates of the last screening rung are measured in full, a few at a time (backfill). Speed is process CPU time per
call (``timing="cpu"``, the steadier figure on a shared machine) or wall time.

All of that runs on the selection ``seed``. The pick's figures there are biased upwards (it won on that
sample), so the baseline, the pick and the frontier are then measured again on ``report_seed``, with the full
image count (``fastdiff.tune.report``): the result carries both (``selection``, ``report``) and whether the pick
still meets each budget on the report seed. The pick is never changed by the report.

Example::

    from fastdiff.tune import tune

    result = tune("/tmp/digits", ["accuracy>=-1 point"], guidance=2.0, cache_dir="/tmp/tune-cache")
    print(result["best"]["spec"], result["best"]["speedup"])  # selection seed (0): the figures it was picked on
    print(result["report"]["best"]["speedup"], result["report"]["within_budget"])  # report seed (1)
    # FastPipeline.from_pretrained("/tmp/digits", accelerators=result["best"]["spec"])
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from fastdiff.tune.budget import VS_BASELINE, Budget, parse_budgets, slack_for
from fastdiff.tune.measure import Measurer
from fastdiff.tune.report import figures, rate, report_on, verdicts
from fastdiff.tune.space import Space, baseline_spec, default_space, family_of, load_space


def tune(
    model: str | Path,
    budgets,
    space: str | Path | dict | Space | None = None,
    baseline: str | None = None,
    time_limit: float | None = None,
    cache_dir: str | Path | None = None,
    guidance: float | None = None,
    seed: int = 0,
    threads: int | None = 1,
    steps: int | None = 20,
    timing: str = "cpu",
    progress: bool = True,
    report_seed: int = 1,
) -> dict[str, Any]:
    """Search ``space`` on ``model`` for the fastest spec within ``budgets`` (strings or Budget objects).

    The search (every rung, budget check and the pick) runs on ``seed``; the baseline, the pick and the
    frontier are then measured again on ``report_seed`` (must differ from ``seed``) at the full image count.
    ``time_limit`` (minutes) stops starting new measurements; the answer then comes from what was measured in
    full (the baseline and the pick are still measured on the report seed). Returns a JSON-able dict: ``best``
    (spec, speedup, metrics, per-budget ``verdicts``), ``frontier``, ``baseline`` (these three on the selection
    seed), ``seeds``, ``selection`` and ``report`` (the figures on each seed; ``report["within_budget"]``: whether
    the pick meets every budget on the report seed), ``candidates``, ``rungs``, ``pruned``, ``counts`` (of the
    search; the report's are in ``report["counts"]``), ``search_seconds``, ``complete``.
    """
    start = time.perf_counter()
    if report_seed == seed:
        raise ValueError(
            f"the report seed equals the selection seed ({seed}): the pick is reported on a second sample, "
            "give a different report seed"
        )
    if timing not in ("cpu", "wall"):
        raise ValueError(f"timing must be 'cpu' or 'wall', got {timing!r}")
    if time_limit is not None and time_limit <= 0:
        raise ValueError(f"time limit must be a positive number of minutes, got {time_limit}")
    if isinstance(budgets, str) or not all(isinstance(b, Budget) for b in budgets):
        budgets = parse_budgets([budgets] if isinstance(budgets, str) else [str(b) for b in budgets])
    measurer = Measurer(model, cache_dir=cache_dir, guidance=guidance, seed=seed, threads=threads, steps=steps)
    if not isinstance(space, Space):
        space = load_space(space if space is not None else default_space(family_of(measurer.fp.pipe)), baseline)
    elif baseline:
        space.baseline = baseline_spec(baseline)
    settings = space.settings
    measurer.settings.update(runs=settings["runs"], warmup=settings["warmup"])
    candidates, pruned = space.candidates(cfg=measurer.cfg)
    full = settings["images"] or measurer.facts.default_batch
    rungs = (
        [full]
        if len(candidates) <= settings["grid_max"]
        else (settings["rungs"] or derive_rungs(full, settings["eta"], measurer.facts.num_classes))
    )
    speed = "cpu_seconds_median" if timing == "cpu" else "seconds_median"
    deadline = None if time_limit is None else start + 60 * time_limit

    plan = _plan(len(candidates), rungs, settings)
    bar = tqdm(total=plan + len(rungs), desc="tune", unit="meas", disable=not progress)
    base_rows = {}
    for n in rungs:  # the baseline at every size: relative budgets and PSNR compare at equal sample counts
        bar.set_postfix_str(f"baseline @{n}")
        base_rows[n] = measurer.measure(space.baseline, n, baseline=True)
        bar.update()
        for budget in budgets:
            if budget.metric not in VS_BASELINE and base_rows[n].get(budget.metric) is None:
                raise ValueError(
                    f"budget {budget}: {Path(model).name} reports no {budget.metric!r} "
                    f"(it reports {', '.join(k for k in ('accuracy', 'fd', 'ode_error') if k in base_rows[n]) or 'only psnr/ssim'})"
                )
    rows: dict[str, dict[int, dict]] = {spec: {} for spec in candidates}
    alive, complete = list(candidates), True
    reserve: list[str] = []  # plausible candidates of the last screening rung that were not promoted

    def run_rung(specs: list[str], n: int) -> bool:
        for spec in specs:
            if deadline is not None and time.perf_counter() > deadline:
                return False
            bar.set_postfix_str(f"@{n} {spec[:60]}")
            rows[spec][n] = measurer.measure(spec, n)
            bar.update()
        return True

    for level, n in enumerate(rungs):
        complete = run_rung(alive, n)
        if not complete or level == len(rungs) - 1:
            break
        order, plausible = rank(alive, rows, n, full, budgets, base_rows[n], speed)
        keep = _keep_count(len(alive), settings)
        alive, reserve = order[:keep], [s for s in order[keep:] if s in plausible]
    base_full = dict(base_rows[full], name="baseline")
    while complete and reserve and not any(_holds(rows[s].get(full), budgets, base_full) for s in candidates):
        # nothing promoted held at full size: measure the next plausible ones in rank order (backfill)
        batch, reserve = reserve[: settings["min_keep"]], reserve[settings["min_keep"] :]
        bar.total += len(batch)
        complete = run_rung(batch, full)

    base_full = dict(base_rows[full], name="baseline")
    measured = [rows[s][full] for s in candidates if full in rows[s] and "error" not in rows[s][full]]
    for row in [base_full, *measured]:
        rate(row, base_full, speed)
        row["within_budget"] = all(b.holds(row, base_full) for b in budgets)
    feasible = [r for r in [base_full, *measured] if r["within_budget"]]
    best = min(feasible, key=lambda r: r[speed]) if feasible else None  # an absolute budget the baseline misses
    frontier = pareto([base_full, *measured], budgets, speed)
    if best is not None:
        best = {
            "spec": best["spec"],
            "speedup": best["speedup"],
            **figures(best, speed),
            "verdicts": verdicts(best, base_full, budgets),
        }
    search_seconds, counts = time.perf_counter() - start, (measurer.runs, measurer.hits)

    def step(spec: str) -> None:
        bar.total += 1
        bar.set_postfix_str(f"report seed {report_seed} {spec[:50]}")
        bar.update()

    report = report_on(
        measurer, report_seed, space.baseline, best and best["spec"], frontier, budgets, full, speed, deadline, step
    )
    bar.close()
    return {
        "model": str(model),
        "model_hash": measurer.model_hash,
        "fastdiff_version": measurer.version,
        "budgets": [str(b) for b in budgets],
        "seeds": {"selection": seed, "report": report_seed},
        "timing": timing,
        "settings": {**measurer.settings, "images": full},
        "strategy": "grid" if len(rungs) == 1 else "successive-halving",
        "rungs": rungs,
        "space": space.to_dict(),
        "pruned": pruned,
        "baseline": base_full,
        "best": best,
        "frontier": frontier,
        "selection": {
            "seed": seed,
            "images": full,
            "baseline": {"spec": base_full["spec"], **figures(base_full, speed)},
            "best": best,
            "within_budget": None if best is None else best["within_budget"],
            "frontier": frontier,
        },
        "report": report,
        "candidates": [{"spec": s, "measurements": list(rows[s].values())} for s in candidates if rows[s]],
        "counts": {
            "candidates": len(candidates),
            "measurements": counts[0],
            "cache_hits": counts[1],
            "full_measurements": len(measured),
        },
        "complete": complete,
        "search_seconds": search_seconds,
    }


def derive_rungs(full: int, eta: int, multiple: int = 0) -> list[int]:
    """Image counts of the successive-halving rungs: ``full/eta^2, full/eta, full`` (at least 10; rounded down
    to a multiple of the class count so every class has the same number of samples)."""
    rungs = {full}
    for power in (1, 2):
        n = max(10, full // eta**power)
        if multiple and n > multiple:
            n -= n % multiple
        if n < full:
            rungs.add(n)
    return sorted(rungs)


def _plan(count: int, rungs: list[int], settings: dict) -> int:
    total, alive = 0, count
    for _ in range(len(rungs)):
        total += alive
        alive = _keep_count(alive, settings)
    return total


def _keep_count(alive: int, settings: dict) -> int:
    return min(alive, max(settings["min_keep"], math.ceil(alive / settings["eta"])))


def _holds(row: dict | None, budgets: list[Budget], baseline: dict) -> bool:
    return row is not None and "error" not in row and all(b.holds(row, baseline) for b in budgets)


def rank(
    alive: list[str], rows: dict, n: int, full: int, budgets: list[Budget], baseline: dict, speed: str
) -> tuple[list[str], set[str]]:
    """Candidates in promotion order after rung ``n``, and the set of those plausibly within budget.

    Order: those within budget at this rung and those within it only with the screening slack (for ``n`` <
    ``full`` images), alternately, each by speed; then the others by how far they miss. The caller keeps the
    first 1/eta (at least ``min_keep``).
    """

    def group(spec: str):
        row = rows[spec].get(n)
        if row is None or "error" in row:
            return 3, math.inf
        strict = [b.margin(row, baseline) for b in budgets]
        loose = [b.margin(row, baseline, slack_for(b, n, full, baseline)) for b in budgets]
        if all(m is not None and m >= 0 for m in strict):
            return 0, row[speed]
        if all(m is not None and m >= 0 for m in loose):
            return 1, row[speed]
        miss = sum(
            -m / max(abs(b.threshold(baseline)), 1e-9) for b, m in zip(budgets, loose) if m is not None and m < 0
        )
        return 2, miss

    keyed = sorted((group(s), s) for s in alive)
    within = [[s for k, s in keyed if k[0] == g] for g in (0, 1)]
    order = [s for pair in itertools.zip_longest(*within) for s in pair if s is not None]
    order += [s for k, s in keyed if k[0] >= 2]
    return order, set(within[0]) | set(within[1])


def pareto(rows: list[dict], budgets: list[Budget], speed: str) -> list[dict]:
    """Rows not dominated in (speed, every budget metric in its better direction), fastest first."""
    from fastdiff.tune.budget import IDENTICAL, METRICS

    metrics = list(dict.fromkeys(b.metric for b in budgets))

    def vector(row):
        values = [row[speed]]
        for m in metrics:
            value = row.get(m, IDENTICAL.get(m) if row.get("is_baseline") else None)
            value = math.inf if value is None else float(value)
            values.append(-value if METRICS[m][0] == "higher" else value)
        return values

    vectors = [vector(r) for r in rows]
    front = []
    for i, v in enumerate(vectors):
        dominated = any(
            all(a <= b for a, b in zip(w, v)) and any(a < b for a, b in zip(w, v))
            for j, w in enumerate(vectors)
            if j != i
        )
        if not dominated:
            front.append({"spec": rows[i]["spec"], "speedup": rows[i]["speedup"], **figures(rows[i], speed)})
    return sorted(front, key=lambda r: r["seconds"])


def side_by_side(
    model: str | Path,
    configs: list[tuple[str, str]],
    images: int | None = None,
    guidance: float | None = None,
    runs: int = 1,
    seed: int = 0,
    threads: int | None = 1,
    steps: int | None = 20,
) -> dict:
    """Re-time ``configs`` in one ``run_bench`` call (exactly ``fastdiff bench``), e.g. the baseline, DDIM 50
    and the setting found, so their speedups come from one run. Returns run_bench's result."""
    from fastdiff.eval.bench import run_bench

    return run_bench(
        model,
        configs,
        steps=steps,
        runs=runs,
        seed=seed,
        threads=threads,
        batch=images,
        guidance=guidance,
        warmup=False,
    )
