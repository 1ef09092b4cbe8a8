"""Number formatting, markdown tables and the row layouts several results files share."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import median
from typing import Any

# -- numbers ---------------------------------------------------------------------------------------------


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fx(v: Any, nd: int = 2) -> str | None:
    """A speedup: 2.46x."""
    return None if missing(v) else f"{v:.{nd}f}x"


def pct(v: Any, nd: int = 1) -> str | None:
    """A fraction as a percentage: 0.986 -> 98.6%."""
    return None if missing(v) else f"{100 * v:.{nd}f}%"


def num(v: Any, nd: int = 2) -> str | None:
    return None if missing(v) else f"{v:.{nd}f}"


def sec(v: Any) -> str | None:
    return None if missing(v) else (f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.1 else f"{v:.3f}")


def db(v: Any) -> str | None:
    """PSNR; infinite means identical images."""
    if missing(v):
        return None
    return "identical" if math.isinf(v) else f"{v:.1f} dB"


def rel(v: Any) -> str | None:
    """A relative change: 0.046 -> +4.6%."""
    return None if missing(v) else f"{100 * v:+.1f}%"


def code(v: Any) -> str | None:
    return None if missing(v) or v == "" else f"`{v}`"


def spread(row: dict, key: str) -> str | None:
    """A ratio with its runs' range and verdict, where the row records them: 1.52x (1.40-1.61, level)."""
    if missing(row.get(key)):
        return None
    low, high, verdict = row.get(f"{key}_min"), row.get(f"{key}_max"), row.get(f"{key}_verdict")
    if missing(low) or missing(high):
        return fx(row[key])
    note = "" if verdict in (None, "baseline") else f", {verdict}"
    return f"{fx(row[key])} ({low:.2f}-{high:.2f}{note})"


def over_floor(row: dict) -> str | None:
    """FD / floor with its interval, where the row records it: 1.53 [0.95, 2.58]."""
    if missing(row.get("fd_ratio")):
        return None
    return f"{row['fd_ratio']:.2f} [{row['fd_ratio_low']:.2f}, {row['fd_ratio_high']:.2f}]"


def med(values: Any) -> float | None:
    values = [v for v in values or [] if not missing(v)]
    return median(values) if values else None


# -- tables ----------------------------------------------------------------------------------------------


def table(columns: list[tuple[str, Callable[[Any], Any]]], items: list[Any]) -> str:
    """A markdown table; a column whose every cell is empty is dropped."""
    cells = [[fn(item) for _, fn in columns] for item in items]
    keep = [j for j in range(len(columns)) if any(row[j] not in (None, "") for row in cells)]
    head = "| " + " | ".join(columns[j][0] for j in keep) + " |"
    rule = "|" + "---|" * len(keep)
    body = [
        "| " + " | ".join("-" if row[j] in (None, "") else str(row[j]) for j in keep) + " |" for row in cells
    ]
    return "\n".join([head, rule, *body])


def find(items: list[dict], key: str, value: str) -> dict:
    return next(i for i in items if i.get(key) == value)


# -- common row layouts -----------------------------------------------------------------------------------


def bench_table(configs: list[dict], first: str = "first config") -> str:
    """``fastdiff bench`` / ``run_bench`` rows; speedups and PSNR/SSIM are against the first config."""
    return table(
        [
            ("config", lambda c: c.get("name")),
            ("specs", lambda c: code(c.get("specs"))),
            ("s (median)", lambda c: sec(c.get("seconds_median"))),
            ("CPU s", lambda c: sec(c.get("cpu_seconds_median", c.get("cpu_s_median")))),
            ("NFE", lambda c: c.get("denoiser_calls", c.get("nfe"))),
            ("speedup", lambda c: spread(c, "speedup")),
            ("CPU speedup", lambda c: spread(c, "cpu_speedup")),
            (f"PSNR vs {first}", lambda c: db(c.get("psnr"))),
            ("SSIM", lambda c: num(c.get("ssim"), 4)),
            ("accuracy", lambda c: pct(c.get("accuracy"))),
            ("FD", lambda c: num(c.get("fd"))),
            ("FD floor", lambda c: num(c.get("fd_floor"))),
            ("FD / floor", over_floor),
        ],
        configs,
    )


def selection_tables(d: dict, quality: list[tuple[str, Callable[[Any], Any]]]) -> str:
    """A ``select`` record (:mod:`fastdiff.eval.select`): the candidates on the selection seeds, the pick, and its
    figures (with the target's verdict) on the report seeds."""
    record = d.get("selection") or {}
    rows = record.get("selection") or d.get("partial", {}).get("selection", [])
    report = record.get("report") or d.get("partial", {}).get("report", [])
    verdicts = {(v["guidance"], v["seed"]): v["verdict"] for v in d.get("report_verdicts", [])}
    columns = [("guidance", lambda r: r.get("guidance")), ("seed", lambda r: r.get("seed"))] + quality + [
        ("FD floor [draws' range]", lambda r: f"{r['fd_floor']:.2f} [{r['fd_floor_low']:.2f}, {r['fd_floor_high']:.2f}]"),
        ("FD / floor", over_floor),
    ]  # fmt: skip
    out = f"Selection seeds {record.get('selection_seeds', '-')} ({record.get('rule', 'unfinished')}):\n\n"
    out += table(columns, rows)
    out += f"\n\nChoice: guidance {record.get('choice', '- (unfinished)')}. Report seeds {record.get('report_seeds', '-')}:\n\n"
    out += table(columns + [("target", lambda r: verdicts.get((r.get("guidance"), r.get("seed"))))], report)
    return out


def async_table(model: dict) -> str:
    """parallel_async*.json: one process vs ``parallel(mode=async)`` arms of one model."""
    arms = [(k, v) for k, v in model.items() if isinstance(v, dict) and k != "call"]
    single = model.get("single", {})

    def seconds(arm):
        return sec(med(arm.get("seconds")))

    def fd_change(arm):
        if missing(arm.get("fd")) or missing(single.get("fd")) or arm is single:
            return None
        return rel(arm["fd"] / single["fd"] - 1)

    return table(
        [
            ("run", lambda a: a[0]),
            ("specs", lambda a: code(a[1].get("specs"))),
            ("1 process, s / call", lambda a: " / ".join(sec(s) for s in a[1].get("single_seconds", []))),
            ("s / call (median)", lambda a: seconds(a[1])),
            ("speedup", lambda a: fx(a[1].get("speedup"))),
            ("rounds", lambda a: " / ".join(f"{r:.2f}" for r in a[1].get("round_speedups", []))),
            ("PSNR vs 1 process", lambda a: db(a[1].get("psnr_vs_single"))),
            ("accuracy", lambda a: pct(a[1].get("accuracy"))),
            ("FD", lambda a: num(a[1].get("fd"))),
            ("FD vs 1 process", lambda a: fd_change(a[1])),
            ("FD per batch", lambda a: " / ".join(f"{f:.2f}" for f in a[1].get("fd_per_seed", []))),
            ("layers per stage", lambda a: " / ".join(map(str, a[1].get("layers_per_stage", [])))),
        ],
        arms,
    )


def per_model(
    data: dict, render: Callable[[dict], str], describe: Callable[[dict], str] | None = None
) -> str:
    parts = []
    for name, model in data.items():
        if not isinstance(model, dict):
            continue
        line = f"**{name}**"
        if describe:
            line += f" ({describe(model)})"
        parts.append(f"{line}\n\n{render(model)}")
    return "\n\n".join(parts)


def guidance_images(model: dict) -> str:
    bits = []
    if "guidance_scale" in model.get("call", {}):
        bits.append(f"guidance {model['call']['guidance_scale']:g}")
    if "images" in model:
        bits.append(f"{model['images']} images")
    if model.get("seeds", 1) > 1:
        bits.append(f"{model['seeds']} seeds, FD pooled")
    return ", ".join(bits)


def r_bench(d: dict) -> str:
    first = d["configs"][0]["name"] if d.get("configs") else "first config"
    out = bench_table(d["configs"], first)
    if isinstance(d.get("guidance_2"), dict):
        out += "\n\nSame model, guidance 2, own call:\n\n" + bench_table([d["guidance_2"]], first)
    return out


def r_generic(d: Any) -> str:
    """Files without a renderer: their top-level numbers."""
    if not isinstance(d, dict):
        return "(not a JSON object)"
    rows = [
        (k, v)
        for k, v in d.items()
        if isinstance(v, (int, float, str, bool))
        and not isinstance(v, str)
        or isinstance(v, str)
        and len(v) < 80
    ]
    return (
        table([("field", lambda kv: kv[0]), ("value", lambda kv: kv[1])], rows)
        if rows
        else "(no scalar figures)"
    )
