"""Choose on one sample, report on another: a tuned default (a guidance scale, a threshold) is picked on
selection seeds and its figures are reported on disjoint report seeds, both recorded.

Example::

    from fastdiff.eval.select import lowest_fd_meeting, select_then_report

    def evaluate(guidance, seed):            # one scored run: a dict with at least the metrics the rule reads
        return {"accuracy": ..., "fd": ..., "fd_ratio": ...}

    record = select_then_report(evaluate, [1.0, 1.5, 2.0], selection_seeds=[0], report_seeds=[1],
                                rule=lowest_fd_meeting({"accuracy": 0.9}), also_report=[5.0])
    record["choice"], record["report"]       # the pick, and its rows (and 5.0's) on seed 1
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Rule = Callable[[dict[Any, list[dict]]], Any]


def lowest_fd_meeting(minimums: dict[str, float]) -> Rule:
    """The candidate with the lowest mean FD among those whose mean of each metric in ``minimums`` reaches it;
    the lowest FD of all when none does."""

    def rule(rows_by_value: dict[Any, list[dict]]) -> Any:
        def mean(rows, key):
            return statistics.fmean(r[key] for r in rows)

        ok = [v for v, rows in rows_by_value.items() if all(mean(rows, k) >= m for k, m in minimums.items())]
        pool = ok or list(rows_by_value)
        return min(pool, key=lambda v: mean(rows_by_value[v], "fd"))

    rule.description = "lowest mean FD among candidates with " + ", ".join(  # type: ignore[attr-defined]
        f"mean {k} >= {m}" for k, m in minimums.items()
    )
    return rule


def select_then_report(
    evaluate: Callable[[Any, int], dict],
    candidates: Sequence,
    selection_seeds: Iterable[int],
    report_seeds: Iterable[int],
    rule: Rule,
    also_report: Sequence = (),
    on_row: Callable[[str, dict], None] | None = None,
) -> dict:
    """Run ``evaluate(value, seed)`` for every candidate on the selection seeds, pick with ``rule``, then run the
    pick (and ``also_report``, e.g. the pipeline's own default) on the report seeds. ``on_row(phase, row)`` sees
    each row as it comes (to print it or save partial results)."""
    selection_seeds, report_seeds = list(selection_seeds), list(report_seeds)
    if not candidates:
        raise ValueError("give at least one candidate value")
    if not selection_seeds or not report_seeds:
        raise ValueError(f"need selection and report seeds, got {selection_seeds} and {report_seeds}")
    shared = sorted(set(selection_seeds) & set(report_seeds))
    if shared:
        raise ValueError(f"selection and report seeds must be disjoint; both hold {shared}")
    by_value: dict[Any, list[dict]] = {}
    for value in candidates:
        for seed in selection_seeds:
            row = evaluate(value, seed)
            by_value.setdefault(value, []).append(row)
            if on_row:
                on_row("selection", row)
    choice = rule(by_value)
    report = []
    for value in [choice, *[v for v in also_report if v != choice]]:
        for seed in report_seeds:
            row = evaluate(value, seed)
            report.append(row)
            if on_row:
                on_row("report", row)
    return {
        "selection_seeds": selection_seeds,
        "report_seeds": report_seeds,
        "candidates": list(candidates),
        "rule": getattr(rule, "description", getattr(rule, "__name__", "custom")),
        "selection": [r for rows in by_value.values() for r in rows],
        "choice": choice,
        "report": report,
    }


def target_verdict(row: dict, minimums: dict[str, float], fd_ratio_max: float) -> dict:
    """Whether ``row`` meets a target of metric minimums and FD <= ``fd_ratio_max`` x the floor, read with the
    ratio's interval: "met" when its whole interval is within, "missed" when it is wholly outside or a minimum is
    missed, "undecided" when the interval straddles the bound."""
    low, high = row.get("fd_ratio_low", row["fd_ratio"]), row.get("fd_ratio_high", row["fd_ratio"])
    short = [k for k, m in minimums.items() if row[k] < m]
    if short or low > fd_ratio_max:
        verdict = "missed"
    else:
        verdict = "met" if high <= fd_ratio_max else "undecided"
    return {
        "verdict": verdict,
        "below_minimum": short,
        "fd_ratio": [row["fd_ratio"], low, high],
        "fd_ratio_max": fd_ratio_max,
        **{f"{k}_min": m for k, m in minimums.items()},
    }


def add_selection_arguments(parser, candidates: list[float], also: list[float], n: int) -> None:
    """The ``select`` subcommand's options that every reference shares (its model, steps and threads aside)."""
    parser.add_argument("--guidance", type=float, nargs="+", default=candidates, help="the candidates")
    parser.add_argument("--also", type=float, nargs="*", default=also, help="also reported on the report seeds")
    parser.add_argument("--selection-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--report-seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--n", type=int, default=n, help="images or clips per seeded call")
    parser.add_argument("--json", required=True, help="the results file (rewritten after each row)")


def select_guidance(
    evaluate: Callable[[float, int], dict], args, header: dict, minimums: dict[str, float], fd_ratio_max: float
) -> dict:
    """A reference's ``select`` command: the guidance with the lowest FD among those meeting ``minimums`` on
    ``args.selection_seeds``, then it and ``args.also`` on ``args.report_seeds`` with the target's verdicts;
    ``header`` (model, pipeline, target, ...) heads the results file ``args.json``, saved after every row with
    its provenance."""
    from pathlib import Path

    from fastdiff.eval.provenance import load_average, provenance

    load_start, partial, out = load_average(), {"selection": [], "report": []}, Path(args.json)

    def save(extra: dict) -> dict:
        record = {**header, **extra, **provenance(load_start=load_start)}
        out.write_text(json.dumps(record, indent=1))
        return record

    def on_row(phase: str, row: dict) -> None:
        partial[phase].append(row)
        print(json.dumps({"phase": phase, **row}), flush=True)
        save({"partial": partial})

    record = select_then_report(
        evaluate,
        args.guidance,
        args.selection_seeds,
        args.report_seeds,
        lowest_fd_meeting(minimums),
        args.also,
        on_row,
    )
    verdicts = [
        {"guidance": r["guidance"], "seed": r["seed"], **target_verdict(r, minimums, fd_ratio_max)}
        for r in record["report"]
    ]
    return save({"selection": record, "report_verdicts": verdicts})


__all__ = ["lowest_fd_meeting", "select_then_report", "target_verdict", "add_selection_arguments", "select_guidance"]
