"""Serving, overhead and compatibility: renderers and sections."""

from __future__ import annotations

from .format import code, fx, num, pct, rel, sec, table
from .section import GROUPS, Section


def r_serve_load(d: dict) -> str:
    levels = d["levels"]
    models = [k for k, v in levels.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
    concs = [lv["concurrency"] for lv in levels[models[0]]]

    def cell(model, conc):
        lv = next((x for x in levels[model] if x["concurrency"] == conc), None)
        return None if lv is None else f"{lv['images_per_s']:.1f} ({lv['p50_s']:.2f} / {lv['p99_s']:.2f})"

    out = table(
        [("model: images/s (p50 / p99 s)", lambda m: m)]
        + [(f"concurrency {c}", lambda m, c=c: cell(m, c)) for c in concs],
        models,
    )
    lost, b, s, ray = d.get("lost", {}), d.get("batching", {}), d.get("switching", {}), d.get("ray", {})
    lines = []
    if lost:
        lines.append(
            f"- overload: {lost['requests']} sent at concurrency {lost['concurrency']}: "
            + ", ".join(f"{n} x {code_}" for code_, n in lost["statuses"].items())
            + f"; nothing lost: {lost.get('nothing_lost')}"
        )
    if b:
        lines.append(
            f"- batching gain at concurrency {b['max_batch_16']['concurrency']}: {b['max_batch_16']['images_per_s']:.1f} vs"
            f" {b['max_batch_1']['images_per_s']:.1f} images/s = {fx(b.get('gain'))} (`--max-batch 16` vs 1; target {fx(b.get('target'), 1)})"
        )
    for key, sw in s.items():
        if isinstance(sw, dict) and "cost" in sw:
            lines.append(
                f"- profile switching, `{key.replace('max_batch_', '--max-batch ')}`, concurrency {sw['concurrency']}:"
                f" cost {pct(sw['cost'])} (target {pct(sw['target'], 0)})"
            )
    if ray:
        for lv in ray.get("levels", []):
            lines.append(
                f"- Ray Serve, {ray.get('replicas')} replicas, concurrency {lv['concurrency']}: {lv['images_per_s']:.1f} images/s, "
                + ", ".join(f"{n} x {code_}" for code_, n in lv["statuses"].items())
            )
    return out + "\n\n" + "\n".join(lines)


def r_seed_repro(d: dict) -> str:
    rows = []
    for name, m in d["models"].items():
        t = m.get("throughput", {})
        for key, label in (("exact_off", "off"), ("exact_on", "on")):
            diff = m["difference"][key]
            rows.append((name, m.get("profile"), label, diff, t.get(f"{key}_median")))
    return (
        table(
            [
                ("model", lambda r: r[0]),
                ("profile", lambda r: code(r[1])),
                ("`--exact-seeds`", lambda r: r[2]),
                ("max abs difference", lambda r: r[3]["max_abs"]),
                (
                    "values that differ",
                    lambda r: f"{r[3]['values_differing']} of {r[3]['images'] * r[3]['values_per_image']:,}",
                ),
                ("images that differ", lambda r: f"{r[3]['images_differing']} / {r[3]['images']}"),
                ("images/s (median)", lambda r: num(r[4], 1)),
            ],
            rows,
        )
        + "\n\nBatched requests against each request alone (PNG values 0-255)."
    )


def r_fuzz(d: dict) -> str:
    return (
        table(
            [
                ("run", lambda r: r["run"]),
                ("token", lambda r: r.get("token")),
                ("result", lambda r: r.get("summary")),
                ("failures", lambda r: len(r.get("failures", []))),
                ("s", lambda r: sec(r.get("seconds"))),
            ],
            d["runs"],
        )
        + f"\n\nschemathesis {d.get('schemathesis')}; passed: {d.get('passed')}."
    )


def r_soak(d: dict) -> str:
    rows = [
        ("model", d.get("model")),
        ("duration, rate", f"{d.get('minutes'):g} min at {d.get('rate_per_s'):g} requests/s"),
        ("sent / answered / lost", f"{d.get('sent')} / {d.get('answered')} / {d.get('lost')}"),
        ("server errors (5xx)", d.get("server_errors_5xx")),
        ("valid not 200 / invalid not 4xx", f"{d.get('valid_not_200')} / {d.get('invalid_not_4xx')}"),
        ("valid latency p50 / p99", f"{d.get('valid_p50_s')} / {d.get('valid_p99_s')} s"),
        (
            "server RSS after 1 min / end",
            f"{d.get('rss_mb_at_1min')} / {d.get('rss_mb_end')} MB ({rel(d.get('rss_growth_after_1min'))})",
        ),
        ("passed", d.get("passed")),
    ]
    return table([("", lambda r: r[0]), ("value", lambda r: r[1])], rows)


def r_wrapper(d: dict) -> str:
    return (
        table(
            [
                ("model", lambda _: d.get("model")),
                ("steps", lambda _: d.get("steps")),
                ("pairs", lambda _: len(d.get("raw_seconds", []))),
                ("overhead, CPU time", lambda _: f"{d['overhead_percent_cpu']:+.2f}%"),
                ("overhead, wall time", lambda _: f"{d['overhead_percent_wall']:+.2f}%"),
            ],
            [None],
        )
        + "\n\nRaw diffusers vs `FastPipeline` with no accelerator, interleaved pairs."
    )


def r_host_cost(d: dict) -> str:
    identity = d["identity"]
    head = (
        f"Identity denoiser (a real `StableDiffusionPipeline` whose UNet costs nothing), no accelerator: "
        f"**{identity['added_us_per_step']:+.1f} us per step** added by the wrapper, "
        f"{identity['added_us_per_call']:+.0f} us per call (target: {d['targets_us_per_step']['no accelerator']} us "
        "per step).\n\n"
    )
    rows = table(
        [
            ("model", lambda r: r["model"]),
            ("accelerators", lambda r: code(r["spec"])),
            ("fastdiff's Python per step", lambda r: f"{r['us_per_step']:.0f} us"),
        ],  # fmt: skip
        d["accelerators"],
    )
    return (
        head
        + rows
        + (
            "\n\nPer accelerator: cProfile time in functions defined under `fastdiff/` per step (16- minus 8-step "
            "call), an upper bound: profiling inflates it, and tensor arithmetic written as operators inside those "
            "functions counts (computing on the CPU; on a GPU it only launches)."
        )
    )


def r_compat(d: dict) -> str:
    cells = d["cells"]
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    accels = list(dict.fromkeys(c["accelerator"] for c in cells))

    def mark(c):
        if c["status"] != "ok":
            return c["status"]
        notes = " ".join(c.get("notes", []))
        return (
            "yes"
            + (" (d)" if "direct call: accelerated" in notes else "")
            + (" (s)" if "siblings see it" in notes else "")
        )

    status = {(c["variant"], c["accelerator"]): mark(c) for c in cells}
    failures = sum(len(c.get("failures", [])) for c in cells)
    grid = table(
        [("variant", lambda v: v)] + [(a, lambda v, a=a: status.get((v, a))) for a in accels],
        variants,
    )
    counts = {s: sum(1 for c in cells if c["status"] == s) for s in dict.fromkeys(c["status"] for c in cells)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (
        f"{len(cells)} cells ({summary}), {failures} failed checks, {d.get('seconds')} s. `yes`: every check holds;"
        " `(d)`: direct calls of the diffusers pipeline are accelerated too; `(s)`: sibling pipelines sharing the"
        f" module see the change; `refused`: refused at `accelerate()`, nothing changed.\n\n{grid}"
    )


SECTIONS: dict[str, Section] = {
    "serve_load": Section(
        GROUPS[9],
        "Serving load test",
        "`benchmarks/serve_load.py`",
        "Real servers on loopback: throughput and latency by concurrency, overload, batching gain, profile switching, Ray Serve.",
        r_serve_load,
    ),
    "seed_repro": Section(
        GROUPS[9],
        "Reproducibility by seed",
        "`benchmarks/seed_repro.py`",
        "Images of batched requests against the same requests alone, with and without `--exact-seeds`.",
        r_seed_repro,
    ),
    "fuzz_server": Section(
        GROUPS[9],
        "Server fuzzing (schemathesis)",
        "`benchmarks/fuzz_server.py`",
        "Generated valid and invalid requests against the server's OpenAPI schema.",
        r_fuzz,
    ),
    "soak": Section(
        GROUPS[9], "Soak", "`benchmarks/soak.py`", "The server under mixed valid and invalid load.", r_soak
    ),
    "wrapper_overhead": Section(
        GROUPS[10],
        "Wrapper overhead",
        "`benchmarks/wrapper_overhead.py`",
        "Raw diffusers against FastPipeline with no accelerator.",
        r_wrapper,
    ),
    "host_cost": Section(
        GROUPS[10],
        "Host time per step",
        "`benchmarks/host_cost.py`",
        "What the wrapper and each accelerator add on the host per denoising step.",
        r_host_cost,
    ),
    "compat": Section(
        GROUPS[10],
        "Compatibility matrix",
        "`benchmarks/compat_table.py`",
        "Each accelerator on each pipeline variant under the usage habits (direct calls, size/steps/batch changes, siblings, removal).",
        r_compat,
    ),
}
