"""``fastdiff tune``: the fastest accelerator setting within a quality budget, as a spec string.

Example::

    fastdiff tune digits --budget "accuracy>=-1 point" --guidance 2 --out best.json
    fastdiff tune digits --budget "fd<=1.2x" --space space.yaml --time-limit 20 --out best.json \\
        --compare "ddim 50=scheduler(name=ddim,steps=50)"
    fastdiff tune digits --budget "psnr>=35" --print-space > space.yaml   # the default space, to edit
    fastdiff tune digits --budget "accuracy>=-1 point" --seed 3 --report-seed 4 --out best.json

The search and the pick run on ``--seed``; the baseline, the pick and the frontier are measured again on
``--report-seed`` (another sample) and both sets of figures are printed and written, with whether the pick still
meets each budget there. Then ``FastPipeline.from_pretrained(MODEL, accelerators=json.load(open("best.json"))["best"]["spec"])``.
Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` does the work.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from fastdiff.cli.args import FINITE, NON_NEGATIVE, POSITIVE, POSITIVE_FLOAT, existing_file, named_specs


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to ``subparsers`` (from ``parser.add_subparsers``)."""
    p = subparsers.add_parser("tune", help="find the fastest accelerator setting within a quality budget")
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--budget",
        action="append",
        required=True,
        help="e.g. 'accuracy>=-1 point', 'accuracy>=-0.01', 'fd<=1.2x', 'psnr>=35'; repeat: all must hold",
    )
    p.add_argument(
        "--space",
        type=existing_file,
        help="search space YAML (default: the model family's; see --print-space)",
    )
    p.add_argument(
        "--baseline", help="budgets are relative to this config: specs or 'SAMPLER STEPS' (default dpm++2m 20)"
    )
    p.add_argument("--time-limit", type=POSITIVE_FLOAT, help="minutes; no new measurement starts after it")
    p.add_argument("--out", help="write the result JSON here (best, frontier, every measurement)")
    p.add_argument("--cache", help="measurement cache directory (default $FASTDIFF_CACHE/tune)")
    p.add_argument("--no-cache", action="store_true", help="measure everything again, keep nothing")
    p.add_argument("--guidance", type=FINITE, help="guidance scale of every call (default: the pipeline's)")
    p.add_argument("--steps", type=POSITIVE, default=20, help="steps for specs that do not set them (as bench)")
    p.add_argument(
        "--seed",
        type=NON_NEGATIVE,
        default=0,
        help="selection seed: every search measurement and the pick (default 0)",
    )
    p.add_argument(
        "--report-seed",
        type=NON_NEGATIVE,
        default=1,
        help="the baseline, the pick and the frontier are measured again on this seed and reported "
        "(default 1; must differ from --seed)",
    )
    p.add_argument("--threads", type=POSITIVE, default=1, help="torch threads (default 1)")
    p.add_argument("--timing", default="cpu", choices=["cpu", "wall"], help="speed figure (default: CPU time)")
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=SPECS",
        type=named_specs,
        help="after the search, re-time the baseline, these configs and the best side by side (one bench run, on the report seed)",
    )
    p.add_argument("--compare-runs", type=POSITIVE, default=1, help="timed runs of the side-by-side bench")
    p.add_argument("--print-space", action="store_true", help="print the search space as YAML and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args) -> dict:
    """Tune, print the answer and the frontier, write ``args.out``; returns the result dict."""
    import yaml

    from fastdiff.cli.resolve import cache_dir, parse_configs, resolve_model
    from fastdiff.tune import load_space, parse_budgets, side_by_side, tune
    from fastdiff.tune.space import default_space, family_of

    budgets = parse_budgets(args.budget)  # bad budgets and seeds fail before any model is loaded
    if args.report_seed == args.seed and not args.print_space:
        raise SystemExit(
            f"error: --report-seed {args.report_seed} equals --seed {args.seed}: the pick is chosen on one sample "
            "and reported on another; give a different --report-seed"
        )
    space = load_space(args.space, args.baseline) if args.space else None
    compare = parse_configs(args.compare)
    model = resolve_model(args.model, args.size)
    if args.print_space:
        if space is None:
            from fastdiff import FastPipeline

            space = load_space(default_space(family_of(FastPipeline.from_pretrained(model).pipe)), args.baseline)
        print(yaml.safe_dump(space.to_dict(), sort_keys=False), end="")
        return space.to_dict()
    if not args.out:
        raise SystemExit("error: give --out FILE for the result (or --print-space)")
    result = tune(
        model,
        budgets,
        space=space,
        baseline=args.baseline,
        time_limit=args.time_limit,
        cache_dir=None if args.no_cache else Path(args.cache) if args.cache else cache_dir() / "tune",
        guidance=args.guidance,
        seed=args.seed,
        report_seed=args.report_seed,
        threads=args.threads,
        steps=args.steps,
        timing=args.timing,
        progress=not args.quiet,
    )
    result["command"] = (
        "fastdiff " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["tune"] else None
    )
    best = result["best"]
    if best is None:
        _write(args.out, result)
        raise SystemExit(
            f"error: no measured setting meets {', '.join(result['budgets'])}, not even the baseline "
            f"{result['baseline']['spec']}; measurements are in {args.out}"
        )
    if compare:
        configs = [("baseline", result["baseline"]["spec"]), *compare, ("best", best["spec"])]
        bench = side_by_side(
            model,
            configs,
            images=result["settings"]["images"],
            guidance=args.guidance,
            runs=args.compare_runs,
            seed=args.report_seed,
            threads=args.threads,
            steps=args.steps,
        )
        rows = {row["name"]: row for row in bench["configs"]}
        result["side_by_side"] = {
            "seed": args.report_seed,
            "configs": bench["configs"],
            "best_speedup_cpu": {n: rows[n]["cpu_seconds_median"] / rows["best"]["cpu_seconds_median"] for n in rows},
            "best_speedup_wall": {n: rows[n]["seconds_median"] / rows["best"]["seconds_median"] for n in rows},
        }
    _write(args.out, result)
    print(format_result(result))
    print(
        f"wrote {args.out}; load it with FastPipeline.from_pretrained({str(model)!r}, accelerators={best['spec']!r})"
    )
    return result


def format_result(result: dict) -> str:
    """The answer on the selection and the report seed, each budget's verdict on both, the frontier and (if run)
    the side-by-side speedups, as text."""
    base, best, sel, rep = result["baseline"], result["best"], result["selection"], result["report"]
    lines = [
        f"budgets {', '.join(result['budgets'])} vs baseline {base['spec']} ({result['timing']} time, "
        f"{result['settings']['images']} images); {result['strategy']} over {result['counts']['candidates']} candidates, "
        f"{result['counts']['measurements']} measured + {result['counts']['cache_hits']} cached in "
        f"{result['search_seconds']:.0f} s{'' if result['complete'] else ' (stopped at the time limit)'}",
        f"selected on seed {sel['seed']}, reported on seed {rep['seed']} ({rep['counts']['measurements']} measured + "
        f"{rep['counts']['cache_hits']} cached in {rep['seconds']:.0f} s)",
        f"best: {best['spec']}",
    ]
    for name, figures in (("selection", sel), ("report", rep)):
        row = figures["best"]
        lines.append(
            f"  {name:9s} seed {figures['seed']}: "
            + (f"error {row['error']}" if "error" in row else f"speedup {row['speedup']:.2f}x  " + _quality(row))
            + f"  (baseline {_quality(figures['baseline'])})"
        )
    for budget in result["budgets"]:
        verdict = [_verdict(f["best"]["verdicts"][budget]) for f in (sel, rep)]
        lines.append(f"  {budget}: selection {verdict[0]}, report {verdict[1]}")
    if not rep["within_budget"]:
        lines.append(
            f"  the pick misses the budget on the report seed {rep['seed']} (reported as measured, not re-picked)"
        )
    report_rows = {row["spec"]: row for row in rep["frontier"]}
    lines.append("frontier (fastest first on the selection seed; * within budget): selection | report")
    for row in result["frontier"]:
        again = report_rows.get(row["spec"])
        lines.append(
            f" {_mark(row)} {row['speedup']:6.2f}x  {_quality(row):40s} | "
            + (
                "not re-measured (time limit)"
                if again is None
                else f"error {again['error']}"
                if "error" in again
                else f"{_mark(again)} {again['speedup']:6.2f}x  {_quality(again):40s}"
            )
            + f" {row['spec']}"
        )
    if "side_by_side" in result:
        speedups = result["side_by_side"]["best_speedup_cpu"]
        lines.append(
            f"side by side (CPU, seed {result['side_by_side'].get('seed', rep['seed'])}): best is "
            + ", ".join(f"{v:.2f}x vs {k}" for k, v in speedups.items() if k != "best")
        )
    return "\n".join(lines)


def _mark(row: dict) -> str:
    return "*" if row.get("within_budget") else " "


def _verdict(verdict: dict) -> str:
    value = "n/a" if verdict["value"] is None else f"{verdict['value']:.4g}"
    return f"{'holds' if verdict['holds'] else 'MISSES'} ({value} vs {verdict['threshold']:.4g})"


def _quality(row: dict) -> str:
    parts = []
    for key, fmt in (
        ("accuracy", "{:.1%}"),
        ("fd", "{:.2f}"),
        ("ode_error", "{:.3f}"),
        ("psnr", "{:.1f} dB"),
    ):
        if row.get(key) is not None:
            parts.append(f"{key} " + fmt.format(row[key]))
    return ", ".join(parts)


def _write(path: str, result: dict) -> None:
    """The result as a results record (``fastdiff.eval.record``): this run's provenance added, the command the
    result holds kept."""
    from fastdiff.eval.record import write_record

    write_record(path, result, benchmark="fastdiff tune", indent=1)
