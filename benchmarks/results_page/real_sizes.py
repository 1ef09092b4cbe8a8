"""The README's "real sizes" table: every full-size comparison measured (CPU and GPU), one row each."""

from __future__ import annotations

from operator import itemgetter

from .format import fx, table


def _err(v) -> str | None:
    return None if v is None else ("0 (identical)" if v == 0 else f"{v:.1e}")


def real_sizes_block(results: dict) -> str:
    """The README's "real sizes" table: one row per full-size comparison measured (CPU and GPU)."""
    rows = []
    cpu = results.get("full_size_cpu", {})
    for m in cpu.get("matrix", []):
        by_status = {s: [r for r in m["rows"][1:] if r["status"] == s] for s in ("ok", "refused", "error")}
        exact = all(r["removed_bit_identical"] for r in m["rows"][1:] if "removed_bit_identical" in r)
        cut = f" (cut short: {m['partial']})" if m.get("partial") else ""
        rows.append(
            (
                f"{len(m['rows']) - 1} accelerators, {m['steps']} steps at {m['side']} px{cut}",
                f"{m['model']} {m['dtype']}, CPU",
                f"{len(by_status['ok'])} run, {len(by_status['refused'])} refused with a reason, "
                f"{len(by_status['error'])} failed",
                "plain output again after each" if exact else "NOT exact",
            )
        )
    for t in cpu.get("timed", []):
        base = t["rows"][0]
        for r in t["rows"][1:]:
            rows.append(
                (
                    f"`{r['config']}`" if "(" in r["config"] else r["config"],
                    f"{t['model']} {t['side']} px, {t['steps']} step{'s' if t['steps'] > 1 else ''}, CPU",
                    f"{fx(r['speedup'])} CPU time vs {base['config']}",
                    f"latents {_err(r['rel_err'])} off",
                )
            )
    gpu = results.get("gpu_nvidia_h200_matrix")
    for g in gpu["groups"] if gpu else []:
        for r in g["configs"]:
            if r["name"] in ("compile", "compile+deepcache") and r["status"] == "ok":
                rows.append(
                    (
                        f"`{r['specs']}`",
                        f"{g['model']} {g['dtype']} {g['side']} px, H200",
                        f"{fx(r['speedup'])} wall time vs plain",
                        f"latents {_err(r['quality']['latent_rel_err'])} off",
                    )
                )
    columns = ("what", "model, device", "measured", "output")
    return table([(name, itemgetter(i)) for i, name in enumerate(columns)], rows)
