"""Flow-matching models: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, over_floor, pct, r_bench, rel, sec, selection_tables, spread, table
from .renderers_parallel import r_parallel_cfg
from .section import GROUPS, Section

# benchmarks/flow_caching.py's rows: the config, its cost, the share of the blocks it computed
CACHING_COLUMNS = [
    ("config", lambda r: r["name"]),
    ("setting", lambda r: code(r.get("setting"))),
    ("process", lambda r: r.get("process")),
    ("CPU s", lambda r: sec(r.get("cpu_median"))),
    ("speedup", lambda r: spread(r, "speedup") or fx(r.get("speedup"))),
    ("computed steps", lambda r: num(r.get("computed"), 3)),
]


def _fd_differences(spread: dict | None) -> str:
    """The paired-bootstrap intervals of FD differences (benchmarks/flow_caching.py --fd-bootstrap)."""
    if not spread:
        return ""
    lines = [
        f"- FD {x['a']} - {x['b']}: {x['fd_difference']:+.2f}, 95% interval [{x['ci95'][0]:+.2f}, {x['ci95'][1]:+.2f}]"
        for x in spread["differences"]
    ]
    return f"\n\nFD differences from {spread['resamples']} paired resamples of the images:\n\n" + "\n".join(
        lines
    )


def selection_note(d: dict) -> str:
    """benchmarks/caching_select.py's record: the rule, and each family's candidates on the selection seed."""
    sel = d.get("selection")
    if not sel:
        return ""
    lines = [f"\n\nSettings chosen on seed {sel['seed']} (`{sel['file']}`), reported here on seed {sel['report_seed']}; "
             f"rule: {sel['rule']}.\n"]  # fmt: skip
    for family, verdicts in sel["candidates"].items():
        cells = ", ".join(f"{v['config'].split('=', 1)[0]} {v['cpu_median']:.1f} s / {db(v['psnr'])} / FD {v['fd']:.2f}"
                          f"{'' if v['within_budget'] else ' (out)'}" for v in verdicts)  # fmt: skip
        lines.append(
            f"- {family}: pick {sel['picks'][family].split('=', 1)[0] or 'none'}; candidates {cells}"
        )
    return "\n".join(lines)


def r_flow_caching(d: dict) -> str:
    fd_std = [("FD spread (std)", lambda r: num(r.get("fd_bootstrap_std")))] if d.get("fd_bootstrap") else []
    floor = [("FD / floor", over_floor)] if any("fd_ratio" in r for r in d["rows"]) else []
    return (
        table(
            CACHING_COLUMNS
            + [
                ("accuracy", lambda r: pct(r.get("accuracy"))),
                ("FD", lambda r: num(r.get("fd"))),
            ]
            + floor
            + fd_std
            + [("PSNR vs base", lambda r: db(r.get("psnr")))],
            d["rows"],
        )
        + (
            f"\n\n{d.get('images')} images, {d.get('steps')} steps, guidance {d.get('guidance')}, {d.get('threads')} thread(s);"
            " `fd-*` rows are fastdiff, `hf-*` rows diffusers' own caches (first-block, TaylorSeer, MagCache)."
            + (f" Configs split over {d['split']}." if d.get("split") else "")
        )
        + _fd_differences(d.get("fd_bootstrap"))
        + selection_note(d)
    )


def r_flow_families(d: dict) -> str:
    fams = d["families"]
    names = [r["config"] for r in next(iter(fams.values()))]

    def cell(fam, name):
        row = next((r for r in fams[fam] if r["config"] == name), None)
        if row is None:
            return None
        if row.get("refused"):
            return "refused"
        if name == names[0]:
            return f"{row['cpu_median']:.2f} s"
        return f"{row['speedup']:.2f}x, {db(row.get('psnr')) or '-'}"

    return (
        table(
            [
                ("config", lambda n: n),
                (
                    "specs",
                    lambda n: code(
                        next(r for r in next(iter(fams.values())) if r["config"] == n).get("spec")
                    ),
                ),
            ]
            + [(fam, lambda n, fam=fam: cell(fam, n)) for fam in fams],
            names,
        )
        + f"\n\n{d.get('size')} size, {d.get('steps')} steps, CPU seconds of one call; PSNR against the plain call (random weights)."
    )


def r_digits_flow_build(d: dict) -> str:
    t = d.get("training", {})
    rows = table(
        [
            ("guidance", lambda r: r.get("guidance")),
            ("steps", lambda r: r.get("steps")),
            ("images", lambda r: r.get("images")),
            ("accuracy", lambda r: pct(r.get("accuracy"))),
            ("FD", lambda r: num(r.get("fd"))),
            ("FD floor", lambda r: num(r.get("fd_floor"))),
            ("s / call", lambda r: sec(r.get("seconds"))),
        ],
        d["rows"],
    )
    target = d.get("target", {})
    met = ", ".join(f"guidance {k}: {'yes' if v else 'no'}" for k, v in target.get("met", {}).items())
    text = (
        f"\n\nTraining: {t.get('steps')} steps in {t.get('seconds', 0) / 60:.0f} min, loss {t.get('loss_first', 0):.2f} ->"
        f" {t.get('loss_last', 0):.2f}. Target: accuracy >= {pct(target.get('accuracy_min'), 0)} and FD <= {target.get('fd_max')};"
        f" met: {met}."
    )
    if d.get("default_guidance") is not None:
        text += f" The model's bench guidance (`eval/prompts.json`): {d['default_guidance']:g}."
    shorter = d.get("shorter_build")
    if shorter:
        text += (
            f" A {shorter['steps']}-step build of the same model and schedule: "
            + ", ".join(f"FD {r['fd']:.2f} at guidance {r['guidance']:g}" for r in shorter["rows"])
            + " (500 images)."
        )
    return rows + text


def r_flow_student(d: dict) -> str:
    rows = d["configs"]
    student = next((c for c in rows if c["name"] == "student 4"), None)

    def vs_student(c):
        if student is None or not c["name"].startswith("student"):
            return None
        return fx(student["cpu_seconds_median"] / c["cpu_seconds_median"])

    t = d.get("training", {})
    return table(
        [
            ("config", lambda c: c["name"]),
            ("NFE", lambda c: c.get("denoiser_calls")),
            ("CPU s", lambda c: sec(c.get("cpu_seconds_median"))),
            ("speedup vs teacher 28", lambda c: fx(c.get("cpu_speedup"))),
            ("speedup vs student", vs_student),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("FD floor", lambda c: num(c.get("fd_floor"))),
        ],
        rows,
    ) + (
        f"\n\n{d.get('settings', {}).get('batch')} images per call, guidance"
        f" {d.get('settings', {}).get('inputs', {}).get('guidance_scale')}"
        " (baked into the student), one timed call per config after an untimed warm-up. Student: progressive"
        f" distillation {t.get('from')} -> {t.get('to')} flow Euler steps, {t.get('steps_per_round')} steps per"
        f" round, batch {t.get('batch')}, {t.get('pool')} teacher samples, {t.get('minutes', 0):.0f} min of training."
        + (f" {d['note']}" if d.get("note") else "")
    )


def r_teacache_fit(d: dict) -> str:
    return (
        f"Model {code(d.get('model'))}: polynomial coefficients {', '.join(f'{c:.4g}' for c in d.get('coefficients', []))}"
        f" fitted on {d.get('points')} points, RMS error {num(d.get('rms_error'), 4)}."
    )


def r_tune_flow(d: dict) -> str:
    samplers = list(d["rows"][0]["tuned"]) if d.get("rows") else []
    return (
        table(
            [
                ("NFE", lambda r: r["nfe"]),
                (
                    "best standard (which)",
                    lambda r: f"{r['best']['standard'][1]:.3f} ({r['best']['standard'][0]})",
                ),
                (
                    "best grid standard (which)",
                    lambda r: f"{r['best']['grid_standard'][1]:.3f} ({r['best']['grid_standard'][0]})",
                ),
            ]
            + [(f"tuned {s}", lambda r, s=s: num(r["tuned"][s]["ode_error"], 3)) for s in samplers]
            + [("best tuned vs best standard", lambda r: rel(r.get("tuned_vs_best_standard")))],
            d["rows"],
        )
        + f"\n\nModel: {d.get('model')}; metric: {d.get('metric')}."
    )


def r_digits_flow_defaults(d: dict) -> str:
    t = d.get("target", {})
    quality = [("accuracy", lambda r: pct(r.get("accuracy"))), ("FD", lambda r: num(r.get("fd")))]
    return selection_tables(d, quality) + (
        f"\n\n{d.get('images')} images per seeded call (the bench prompts cycled), flow Euler {d.get('steps')} "
        f"steps. Target: accuracy >= {pct(t.get('accuracy_min'), 0)} and FD <= {t.get('fd_max_over_floor')}x the "
        'like-for-like floor; "met" when the whole FD / floor interval is within it.'
    )


SECTIONS: dict[str, Section] = {
    "digits_flow_defaults": Section(
        GROUPS[6],
        "digits-flow: the default guidance, chosen on one seed and reported on another",
        "`python -m fastdiff.zoo.reference_flow select DIR --json OUT.json`",
        "The guidance with the lowest FD among those meeting the accuracy target on the selection seed, and its"
        " figures on the report seed, against a like-for-like floor.",
        r_digits_flow_defaults,
    ),
    "flow_caching": Section(
        GROUPS[6],
        "Caching on digits-flow vs diffusers' caches",
        "`benchmarks/flow_caching.py`",
        "forecast and blockcache on a trained SD3-shaped model against diffusers' TaylorSeer and MagCache.",
        r_flow_caching,
    ),
    "flow_caching_selection": Section(
        GROUPS[6],
        "Caching on digits-flow: the selection run (seed 0)",
        "`benchmarks/caching_select.py`",
        "Every candidate setting once on selection seed 0; each family's pick is reported on seed 1 above.",
        r_flow_caching,
    ),
    "flow_caching_fd_spread": Section(
        GROUPS[6],
        "Is forecast's FD gap to TaylorSeer noise? (digits-flow, paired bootstrap)",
        "`benchmarks/flow_caching.py --fd-bootstrap`",
        "forecast and diffusers' TaylorSeer in one process, with each FD's spread and intervals of FD differences.",
        r_flow_caching,
    ),
    "flow_caching_taylorseer_steps": Section(
        GROUPS[6],
        "TaylorSeer's own form and steps: forecast(at=attention, after_warmup=1) against diffusers' TaylorSeer",
        "`benchmarks/flow_caching.py --fd-bootstrap`",
        "fastdiff's forecast on the same steps as diffusers' TaylorSeer, of the attention layers and of the output.",
        r_flow_caching,
    ),
    "digits_flow_first_block_fit": Section(
        GROUPS[6],
        "The calibrated first-block threshold on digits-flow, on a seed it was not fitted on",
        "`fastdiff bench` (the command below)",
        "blockcache(mode=first-block) with the threshold `fastdiff fit-first-block` fitted within 30 dB on seed 1000,"
        " beside the default threshold 0.05 and the uncached baseline, on seed 1 (200 images, one run each).",
        r_bench,
    ),
    "flow_caching_first_block": Section(
        GROUPS[6],
        "fastdiff's first-block cache against diffusers' FirstBlockCache (digits-flow)",
        "`benchmarks/flow_caching.py --fd-bootstrap`",
        "The same threshold on the SD3-shaped reference, with diffusers' hook made to run on SD3's last block.",
        r_flow_caching,
    ),
    "flow_families": Section(
        GROUPS[6],
        "Accelerators on the tiny flow families",
        "`benchmarks/flow_families.py`",
        "Every flow family's accelerators on bench-size random-weight builds: speed, and what is refused.",
        r_flow_families,
    ),
    "digits_flow_build": Section(
        GROUPS[6],
        "The digits-flow build",
        "`python -m fastdiff.zoo.reference_flow build / eval`",
        "The SD3-shaped digits reference: training and its accuracy and FD.",
        r_digits_flow_build,
    ),
    "flow_student": Section(
        GROUPS[6],
        "Few-step use: accelerators on a 4-step digits-flow student",
        "`benchmarks/flow_student.sh`",
        "Which accelerators still pay off once a progressive student needs only 4 steps.",
        r_flow_student,
    ),
    "digits_flow_teacache_fit": Section(
        GROUPS[6],
        "TeaCache fit on digits-flow",
        "`fastdiff fit-teacache`",
        "The fitted output-change polynomial of `blockcache(mode=teacache)`.",
        r_teacache_fit,
    ),
    "tune_flow_schedules": Section(
        GROUPS[6],
        "Tuned flow schedules on gmm-flow",
        "`benchmarks/tune_flow_schedules.py`",
        "`ode_error` of tuned flow schedules against the standard flow spacings.",
        r_tune_flow,
    ),
    "parallel_cfg_digits_flow": Section(
        GROUPS[6],
        "parallel(mode=cfg) on digits-flow",
        "`benchmarks/parallel_cfg.py`",
        "The two guidance branches on two processes, flow Euler 28.",
        r_parallel_cfg,
    ),
}
