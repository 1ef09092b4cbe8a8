"""The GPU run's quality figures per row, and its goals and tables read from the measured groups
(``benchmarks/gpu.py``)."""

from __future__ import annotations

import statistics

import numpy as np

from fastdiff.eval.fidelity import psnr


def quality(images: np.ndarray, reference: np.ndarray | None) -> dict:
    """PSNR against the plain images (None when identical, or when either holds NaN/inf: see ``finite``)."""
    finite = bool(np.isfinite(images).all())
    comparable = reference is not None and finite and bool(np.isfinite(reference).all())
    identical = comparable and bool(np.array_equal(images, reference))
    value = psnr(images, reference) if comparable and not identical else None
    return {"psnr_db": value, "identical": identical, "finite": finite, "reference": "plain"}


def relative_error(latent: np.ndarray | None, reference: np.ndarray | None) -> float | None:
    """||latent - reference|| / ||reference|| (0.0: identical); None when either is missing or not finite."""
    if latent is None or reference is None or not (np.isfinite(latent).all() and np.isfinite(reference).all()):
        return None
    scale = float(np.linalg.norm(reference))
    return float(np.linalg.norm(latent - reference)) / scale if scale else None


def targets(groups: list[dict]) -> list[dict]:
    """Each goal as {name, value, target, higher_is_better, met}; value None (and why) when not measured."""
    found: list[dict] = []

    def add(kind: str, name: str, measured: tuple, target: float, higher: bool = True) -> None:
        value, why = measured
        met = None if value is None else bool(value >= target if higher else value <= target)
        entry = dict(name=name, value=value, target=target, higher_is_better=higher, met=met, kind=kind)
        found.append(entry if value is not None else {**entry, "skipped": why})

    def ratio(rows: dict, slow: str, fast: str) -> tuple[float | None, str]:
        a, b = rows.get(slow, {}), rows.get(fast, {})
        if a.get("status") == "ok" and b.get("status") == "ok":
            return a["seconds_median"] / b["seconds_median"], ""
        bad = b if b.get("status") not in (None, "ok") else a
        return None, bad.get("reason", "not in this run")

    def tag(group: dict) -> str:
        return f"{group['model']} {group['dtype']} {group['side']} px"

    matrix = [g for g in groups if g["section"] == "matrix"]
    paired = [r for g in matrix for r in g["paired_plain_over_raw"]]
    overhead = 100 * (statistics.median(paired) - 1) if paired else None
    why = "no matrix group ran"
    add(
        "overhead",
        "wrapper overhead %: FastPipeline without accelerators over raw diffusers",
        (overhead, why),
        1.0,
        False,
    )
    for g in matrix:
        rows = {r["name"]: r for r in g["configs"]}
        for config, goal in (("compile", 2.0), ("compile+deepcache", 5.0), ("cfg-interval", 1.25)):
            add(config, f"{config} speedup over plain, {tag(g)}", ratio(rows, "plain", config), goal)
        if g["dtype"] == "bf16":
            add(
                "fp8",
                f"fp8+compile speedup over bf16 compile, {tag(g)}",
                ratio(rows, "compile", "fp8+compile"),
                1.3,
            )
    tome = [g for g in groups if g["section"] == "tome"]
    for g in tome:
        rows = {r["name"]: r for r in g["configs"]}
        if g["side"] == max(t["side"] for t in tome):  # the 1024 px group (48 px in a dry run)
            add("tome", f"tome speedup over plain, {tag(g)}", ratio(rows, "plain", "tome"), 1.3)
        add("tome-vs-tomesd", f"tomesd s / tome s, {tag(g)}", ratio(rows, "tomesd", "tome"), 1.0)
    goals = {
        "overhead": 1.0,
        "compile": 2.0,
        "compile+deepcache": 5.0,
        "cfg-interval": 1.25,
        "fp8": 1.3,
        "tome": 1.3,
        "tome-vs-tomesd": 1.0,
    }
    for kind, goal in goals.items():  # every goal appears, measured or not
        if not any(t["kind"] == kind for t in found):
            add(
                kind,
                f"{kind}: no group of this run measures it",
                (None, "not in this run"),
                goal,
                kind != "overhead",
            )
    return found


def batch_table(groups: list[dict]) -> list[dict]:
    """Images per second by batch size (the batch section), one row per config and batch."""
    return [
        {
            "model": g["model"],
            "dtype": g["dtype"],
            "side": g["side"],
            "batch": g["batch"],
            "config": row["name"],
            "seconds_median": row["seconds_median"],
            "images_per_s": row["images_per_s"],
        }
        for g in groups
        if g["section"] == "batch"
        for row in g["configs"]
        if row["status"] == "ok"
    ]
