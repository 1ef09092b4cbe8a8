"""Samplers, tuned schedules and the reference models: renderers and sections."""

from __future__ import annotations

from .format import code, db, fx, num, over_floor, pct, r_bench, rel, sec, spread, table
from .section import GROUPS, Section


def r_reference(d: dict) -> str:
    def per100(c):
        images = d.get("settings", {}).get("batch") or 100
        return sec(c["cpu_seconds_median"] * 100 / images) if c.get("cpu_seconds_median") else None

    return table(
        [
            ("config", lambda c: c["name"]),
            ("specs", lambda c: code(c.get("specs"))),
            ("NFE", lambda c: c.get("denoiser_calls")),
            ("CPU s / 100 images", per100),
            ("CPU speedup vs first", lambda c: fx(c.get("cpu_speedup"))),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("FD floor", lambda c: num(c.get("fd_floor"))),
            ("PSNR vs first", lambda c: db(c.get("psnr"))),
        ],
        d["configs"],
    )


def r_schedules_digits(d: dict) -> str:
    return (
        table(
            [
                ("config", lambda c: c["name"]),
                ("NFE", lambda c: c.get("denoiser_calls")),
                ("accuracy", lambda c: pct(c.get("accuracy"))),
                ("FD", lambda c: num(c.get("fd"))),
                ("distance to reference", lambda c: num(c.get("distance_to_reference"), 3)),
                ("CPU s", lambda c: sec(c.get("cpu_seconds_median"))),
            ],
            d["bench"]["configs"],
        )
        + f"\n\nReference: {d.get('reference')}. Tuned timesteps: "
        + "; ".join(f"NFE {k}: {', '.join(map(str, v['timesteps']))}" for k, v in d.get("tuned", {}).items())
    )


def r_schedules_gmm(d: dict) -> str:
    return (
        table(
            [
                ("sampler", lambda r: r["sampler"]),
                ("NFE", lambda r: r["nfe"]),
                ("default", lambda r: num(r["default"]["held_out"], 3)),
                (
                    "best standard (which)",
                    lambda r: f"{r['best_standard_held_out'][1]:.3f} ({r['best_standard_held_out'][0]})",
                ),
                ("tuned", lambda r: num(r["tuned"]["held_out"], 3)),
                ("tuned vs best standard", lambda r: rel(-r["vs_best_standard_held_out"])),
                ("seed 0 only", lambda r: rel(-r["vs_best_standard_seed0"])),
                ("timesteps", lambda r: ", ".join(map(str, r.get("timesteps", [])))),
            ],
            d["rows"],
        )
        + f"\n\n`ode_error` (lower is better) over held-out seeds {d['measure']['seeds'][0]}-{d['measure']['seeds'][-1]} x {d['measure']['samples_per_seed']} samples."
    )


def r_digits_sd_longer(d: dict) -> str:
    rows = [("3000 (first build)", d["shipped_3000"])] + [(k, v) for k, v in d["resumed"].items()]
    return (
        table(
            [
                ("text encoder + UNet steps", lambda r: r[0]),
                (
                    "guidance 5: accuracy / FD",
                    lambda r: f"{pct(r[1]['guidance_5']['accuracy'])} / {r[1]['guidance_5']['fd']:.2f}",
                ),
                (
                    "guidance 2: accuracy / FD",
                    lambda r: f"{pct(r[1]['guidance_2']['accuracy'])} / {r[1]['guidance_2']['fd']:.2f}",
                ),
            ],
            rows,
        )
        + f"\n\nFD floor {d.get('fd_floor')}; target FD at guidance 5: {d.get('target_fd_at_guidance_5')}."
    )


def r_digits_sd_seeds(d: dict) -> str:
    return (
        table(
            [
                ("guidance", lambda r: r.get("guidance")),
                ("seed", lambda r: r.get("seed")),
                ("accuracy", lambda r: pct(r.get("accuracy"))),
                ("FD", lambda r: num(r.get("fd"))),
                ("FD floor", lambda r: num(r.get("fd_floor"))),
            ],
            d["runs"],
        )
        + f"\n\nModel: {d.get('model')}. Target: {d.get('target')}."
    )


def r_accelerators_digits(d: dict) -> str:
    head = (f"{d['settings']['batch']} images, seed {d['settings']['seed']}, {d['settings']['runs']} alternating "
            f"rounds, {d['settings']['processes']}. Ratios are of CPU time, with their range over the rounds.\n\n")  # fmt: skip
    return head + table(
        [
            ("config", lambda c: c["name"]),
            ("specs", lambda c: code(c["specs"])),
            ("parameters", lambda c: f"{c['params']:,}" if c.get("params") else None),
            ("CPU s (median)", lambda c: sec(c["cpu_seconds_median"])),
            ("vs DDIM 50", lambda c: spread(c, "cpu_speedup")),
            ("vs dpm++2m 20", lambda c: spread(c["vs_dpm"], "cpu_speedup")),
            ("accuracy", lambda c: pct(c["accuracy"])),
            ("FD", lambda c: num(c["fd"])),
            ("FD / floor", over_floor),
        ],
        d["configs"],
    )


SECTIONS: dict[str, Section] = {
    "accelerators_digits": Section(
        GROUPS[0],
        "Every digits accelerator in one run",
        "`benchmarks/accelerators_digits.py bench`",
        "The README's digits rows against one baseline, side by side in alternating rounds (pruned and low-rank "
        "models recovered by `benchmarks/accelerators_digits.py build`).",
        r_accelerators_digits,
    ),
    "reference_shipped_g1": Section(
        GROUPS[0],
        "The shipped digits reference, guidance 1",
        "`fastdiff bench`, tabulated by `benchmarks/reference_report.py`",
        "Accuracy, FD and CPU time of the sampler presets on the shipped digits reference (500 images).",
        r_reference,
    ),
    "reference_g1": Section(
        GROUPS[0],
        "Digits reference samplers, guidance 1 (another build)",
        "`fastdiff bench`, tabulated by `benchmarks/reference_report.py`",
        "The yardstick's sampler rows on another 3000-step build of the digits reference (not the shipped files).",
        r_reference,
    ),
    "reference_g2": Section(
        GROUPS[0],
        "Digits reference samplers, guidance 2 (another build)",
        "`fastdiff bench`, tabulated by `benchmarks/reference_report.py`",
        "The yardstick's sampler rows at guidance 2.",
        r_reference,
    ),
    "reference_ddpm_g1": Section(
        GROUPS[0],
        "DDPM 1000 steps, guidance 1",
        "`fastdiff bench`, tabulated by `benchmarks/reference_report.py`",
        "Ancestral sampling as trained: the slow end of the yardstick.",
        r_reference,
    ),
    "reference_ddpm_g2": Section(
        GROUPS[0],
        "DDPM 1000 steps, guidance 2",
        "`fastdiff bench`, tabulated by `benchmarks/reference_report.py`",
        "Ancestral sampling as trained, at guidance 2.",
        r_reference,
    ),
    "samplers_tiny_sd": Section(
        GROUPS[0],
        "Samplers on tiny-sd",
        "`fastdiff bench`",
        "Sampler presets on the SD-shaped tiny-sd (random weights): time and fidelity to DDIM 50.",
        r_bench,
    ),
    "schedules_digits": Section(
        GROUPS[0],
        "Tuned schedules on the digits reference",
        "`benchmarks/tune_schedules.py digits`",
        "DPM++2M on tuned timesteps against its default spacing and Karras sigmas at equal NFE.",
        r_schedules_digits,
    ),
    "schedules_gmm": Section(
        GROUPS[0],
        "Tuned schedules on the exact-score model, first timestep pinned",
        "`benchmarks/tune_schedules.py gmm`",
        "`ode_error` of tuned schedules against the best standard spacing, first timestep at T-1 (`--pin-first`).",
        r_schedules_gmm,
    ),
    "schedules_gmm_nfe6_free_start": Section(
        GROUPS[0],
        "Tuned schedules on the exact-score model, first timestep free",
        "`benchmarks/tune_schedules.py gmm --samplers unipc dpm++2m --nfes 6`",
        "`ode_error` at NFE 6 with the first timestep free (the default).",
        r_schedules_gmm,
    ),
    "digits_sd_seeds": Section(
        GROUPS[0],
        "digits-sd quality on three seeds",
        "`fastdiff bench`",
        "The shipped text-conditional reference: accuracy and FD at guidance 5 and 2, three seeds.",
        r_digits_sd_seeds,
    ),
    "digits_sd_longer": Section(
        GROUPS[0],
        "digits-sd: FD against training length",
        "`fastdiff reference build --kind sd --resume`",
        "Accuracy and FD of digits-sd as its training was extended in steps of 3000.",
        r_digits_sd_longer,
    ),
}
