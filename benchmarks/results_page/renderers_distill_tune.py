"""Distillation and autotuning: renderers and sections."""

from __future__ import annotations

from .format import code, fx, num, pct, r_bench, sec, table
from .section import GROUPS, Section


def r_distill(d: dict) -> str:
    images = d.get("settings", {}).get("batch") or 100
    return table(
        [
            ("config", lambda c: c["name"]),
            ("NFE", lambda c: c.get("denoiser_calls")),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("FD floor", lambda c: num(c.get("fd_floor"))),
            ("CPU s / 100 images", lambda c: sec(c["cpu_seconds_median"] * 100 / images)),
            ("CPU speedup vs teacher DDIM 50", lambda c: fx(c.get("cpu_speedup"), 1)),
        ],
        d["configs"],
    )


def r_distill_training(d: dict) -> str:
    return table(
        [
            ("student", lambda kv: kv[0]),
            ("kind", lambda kv: kv[1]["command"].get("command")),
            ("LoRA rank", lambda kv: kv[1]["command"].get("lora")),
            ("training steps", lambda kv: kv[1].get("train_steps")),
            ("batch", lambda kv: kv[1]["command"].get("batch")),
            ("wall time", lambda kv: f"{kv[1]['wall_seconds'] / 60:.1f} min"),
            ("peak memory", lambda kv: f"{kv[1]['peak_memory_mib']:.0f} MiB"),
            (
                "trained parameters",
                lambda kv: f"{kv[1]['trainable_parameters']:,} of {kv[1]['parameters']:,}",
            ),
            ("device", lambda kv: ", ".join(kv[1].get("device", []))),
        ],
        list(d.items()),
    )


def r_tune_summary(d: dict) -> str:
    out = table(
        [
            ("budget", lambda kv: f"`{kv[0]}`"),
            ("setting found", lambda kv: code(kv[1]["best_spec"])),
            (
                "accuracy / FD",
                lambda kv: f"{pct(kv[1]['side_by_side']['accuracy'])} / {kv[1]['side_by_side']['fd']:.2f}",
            ),
            (
                "CPU speedup vs dpm++2m 20",
                lambda kv: fx(kv[1]["side_by_side"]["speedup_cpu_vs_dpm++2m_20"], 1),
            ),
            ("vs DDIM 50", lambda kv: fx(kv[1]["side_by_side"]["speedup_cpu_vs_ddim_50"], 1)),
            (
                "search time",
                lambda kv: (
                    f"{kv[1]['search']['search_seconds']:.0f} s ({kv[1]['search']['measurements']} measurements, {kv[1]['search']['cache_hits']} cached)"
                ),
            ),
        ],
        list(d["results"].items()),
    )
    st = d.get("students")
    if st:
        out += (
            "\n\nWith the distilled students in the space (`"
            + st.get("command", "").split("--budget")[0].strip()
            + " ...`), within budget:\n\n"
        )
        out += table(
            [
                ("spec", lambda r: code(r["spec"])),
                ("CPU speedup vs DDIM 50", lambda r: fx(r["speedup_cpu_vs_ddim_50"], 1)),
                ("accuracy", lambda r: pct(r["accuracy"])),
                ("FD", lambda r: num(r["fd"])),
            ],
            st["within_budget"],
        )
    return out


def r_tune_run(d: dict) -> str:
    base = d.get("baseline", {})
    out = (
        f"Budgets {', '.join(f'`{b}`' for b in d.get('budgets', []))} against {code(base.get('spec'))}"
        f" ({pct(base.get('accuracy'))}, FD {num(base.get('fd'))}); strategy {d.get('strategy')}, rungs {d.get('rungs')};"
        f" {d.get('counts', {}).get('candidates')} candidates, {d.get('counts', {}).get('measurements')} measurements,"
        f" {d.get('counts', {}).get('cache_hits')} cache hits; search {d.get('search_seconds', 0):.0f} s; complete: {d.get('complete')}.\n\n"
        "Pareto frontier of the full measurements (fastest first):\n\n"
    )
    return out + table(
        [
            ("spec", lambda r: code(r["spec"])),
            ("speedup (in search)", lambda r: fx(r.get("speedup"), 1)),
            ("accuracy", lambda r: pct(r.get("accuracy"))),
            ("FD", lambda r: num(r.get("fd"))),
            ("NFE", lambda r: r.get("denoiser_calls")),
            ("within budget", lambda r: "yes" if r.get("within_budget") else "no"),
        ],
        d.get("frontier", []),
    )


def r_tune_side_by_side(d: dict) -> str:
    """A tuner run, then its ``--compare`` bench: the baseline, the named configs and the best, in one run."""
    out = r_tune_run(d)
    rows = d.get("side_by_side", {}).get("configs", [])
    if rows:
        out += "\n\nRe-timed side by side in one `fastdiff bench` run (CPU time):\n\n" + table(
            [
                ("config", lambda r: r["name"]),
                ("spec", lambda r: code(r["specs"])),
                ("CPU speedup", lambda r: fx(r.get("cpu_speedup"), 2)),
                ("accuracy", lambda r: pct(r.get("accuracy"))),
                ("FD", lambda r: num(r.get("fd"))),
                ("PSNR vs baseline", lambda r: num(r.get("psnr"))),
            ],
            rows,
        )
    return out


def r_onestep_split(d: dict) -> str:
    rows = [(name, row) for name, model in d["models"].items() for row in model]
    parts = ("denoiser", "vae", "text encoder", "scheduler", "other")
    return table(
        [("model", lambda r: r[0]), ("batch", lambda r: r[1]["batch"]), ("px", lambda r: r[1]["side"] or "default"),
         ("s per call", lambda r: sec(r[1]["seconds"]["total"])),
         *[(p, lambda r, p=p: pct(r[1]["share"].get(p), 0)) for p in parts]],
        rows,
    )  # fmt: skip


def r_onestep_training(d: dict) -> str:
    def updates(r):
        train = r["train"]
        return sum(v["steps"] for v in train.values()) if "steps" not in train else train["steps"]

    def report(r):
        row = (r.get("measured") or r.get("student") or {}).get("1")
        return f"{pct(row['accuracy'])} / FD {row['fd']:.2f} (seed {row['seed']})" if row else None

    def pick(r):
        s = r.get("selection")
        return f"{s['choice']} of {len(s['candidates'])} on seeds {s['selection_seeds']}" if s else "-"

    return table(
        [("student", lambda r: r["name"]), ("updates", updates),
         ("wall time", lambda r: f"{r['time']['wall_seconds'] / 60:.1f} min" if r.get("time") else None),
         ("peak RSS", lambda r: f"{r['time']['peak_rss_mib']:.0f} MiB" if r.get("time") else None),
         ("checkpoint", pick), ("1 step, report seed", report)],
        d["students"],
    )  # fmt: skip


def r_onestep_memory(d: dict) -> str:
    def peak(r, key):
        if r.get("not_run"):
            return f"not run: about {r['estimated_state_mib'] / 1024:.1f} GiB before activations (estimate)"
        return f"{r[key] / 1024:.1f} GiB"

    return table(
        [("denoiser", lambda r: r["model"]), ("mode", lambda r: r["mode"]),
         ("trained parameters", lambda r: f"{r['trainable_parameters'] / 1e6:.1f}M" if "trainable_parameters" in r else None),
         ("peak after loading", lambda r: None if r.get("not_run") else peak(r, "loaded_peak_mib")),
         ("peak in the step", lambda r: peak(r, "step_peak_mib")),
         ("step", lambda r: None if r.get("not_run") else f"{r['step_seconds']:.1f} s")],
        d["rows"],
    )  # fmt: skip


SECTIONS: dict[str, Section] = {
    "onestep_training": Section(
        GROUPS[4],
        "Training the one-step students (2 CPU cores)",
        "`benchmarks/onestep_training.py` over `benchmarks/onestep_digits.sh`'s students",
        "Wall time and peak memory of each training command, the snapshot picked on the selection seed, and the "
        "student's figures on the report seed.",
        r_onestep_training,
    ),
    "onestep_g2": Section(
        GROUPS[4],
        "One-step students by distribution matching, guidance 2",
        "`benchmarks/onestep_digits.sh`",
        "The DMD student (snapshot picked on seed 0) beside the teacher and the progressive 1-step student it "
        "starts from, measured on seed 1 in alternating rounds.",
        r_bench,
    ),
    "onestep_g1": Section(
        GROUPS[4],
        "One-step students by distribution matching, guidance 1",
        "`DMD_STEPS=600 benchmarks/onestep_digits.sh ROOT 1`",
        "The DMD student (snapshot picked on seed 0) beside the teacher and the progressive 1-step student it "
        "starts from, measured on seed 1 in alternating rounds.",
        r_bench,
    ),
    "onestep_g1_reg-ema": Section(
        GROUPS[4],
        "One-step at guidance 1 with DMD's regression loss and EMA weights",
        '`VARIANT=reg-ema VARIANT_ARGS="--regression 0.25 --ema-decay 0.99" DMD_STEPS=900 bash '
        "benchmarks/onestep_digits.sh ROOT 1`",
        "DMD from the progressive 1-step student with the MSE to 256 teacher ODE samples (weight 0.25) and EMA "
        "weights (decay 0.99), 900 updates, picked on seed 0; beside the plain DMD student, the progressive start "
        "and the teacher, on seed 1 in alternating rounds.",
        r_bench,
    ),
    "onestep_g1_reg-ema-more": Section(
        GROUPS[4],
        "One-step at guidance 1: 600 more updates of the regression + EMA student",
        '`VARIANT=reg-ema-more VARIANT_INIT=ROOT/dmd-reg-ema-g1/steps-1 VARIANT_ARGS="--regression 0.25 '
        '--ema-decay 0.99" DMD_STEPS=600 bash benchmarks/onestep_digits.sh ROOT 1`',
        "The regression + EMA student trained on for 600 updates (picked on seed 0), beside it, plain DMD, the "
        "progressive start and the teacher, on seed 1 in alternating rounds.",
        r_bench,
    ),
    "onestep_memory": Section(
        GROUPS[4],
        "One DMD training step's peak memory, LoRA and full mode",
        "`benchmarks/onestep_memory.py`",
        "Published denoiser layouts with random weights, 256 px, batch 1, fp32, CPU; full mode is not run where its "
        "weights, gradients and AdamW states alone exceed the machine's memory.",
        r_onestep_memory,
    ),
    "onestep_split": Section(
        GROUPS[4],
        "Where a one-step call spends its time",
        "`benchmarks/onestep_split.py`",
        "Text encoder, denoiser and VAE decode shares of a one-denoiser-call pipeline call (CPU).",
        r_onestep_split,
    ),
    "distill_g2": Section(
        GROUPS[4],
        "Distilled students, guidance 2",
        "`benchmarks/distill_bench.sh`",
        "Progressive, consistency and LCM-LoRA students of the digits reference against the teacher, guidance baked in.",
        r_distill,
    ),
    "distill_g1": Section(
        GROUPS[4],
        "Distilled students, guidance 1",
        "`benchmarks/distill_bench.sh`",
        "The same students trained and sampled without guidance.",
        r_distill,
    ),
    "distill_training": Section(
        GROUPS[4],
        "Student training",
        "`benchmarks/train_students.sh`",
        "Training steps, time and memory of each student on the CPU.",
        r_distill_training,
    ),
    "tune_digits": Section(
        GROUPS[5],
        "fastdiff tune on the digits reference",
        "`fastdiff tune`",
        "The fastest setting within each quality budget, re-timed side by side with the baseline and DDIM 50.",
        r_tune_summary,
    ),
    "tune_digits_accuracy": Section(
        GROUPS[5],
        "Tuner run: accuracy budget",
        "`fastdiff tune`",
        "Every measurement of the search under `accuracy>=-1 point`.",
        r_tune_run,
    ),
    "tune_digits_fd": Section(
        GROUPS[5],
        "Tuner run: FD budget",
        "`fastdiff tune`",
        "Every measurement of the search under `fd<=1.2x`.",
        r_tune_run,
    ),
    "tune_digits_flow": Section(
        GROUPS[5],
        "Tuner run: digits-flow",
        "`fastdiff tune`",
        "The tuner on the flow-matching reference (flow samplers x steps x caching x guidance window) against flow "
        "Euler 28 at the model's guidance 1.5, within 1 accuracy point and 1.2x the FD.",
        r_tune_side_by_side,
    ),
    "tune_digits_students": Section(
        GROUPS[5],
        "Tuner run: distilled students",
        "`fastdiff tune`",
        "The tuner over the distilled students against DDIM 50.",
        r_tune_run,
    ),
    "tune_digits_side_by_side": Section(
        GROUPS[5],
        "Tuner answers side by side",
        "`fastdiff bench`",
        "The baseline, DDIM 50 and both answers in one `fastdiff bench` run (the first row only absorbs first-call costs).",
        r_bench,
    ),
}
