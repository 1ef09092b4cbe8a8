"""One chart per reference model: every setting of its headline run, speedup against FD, accuracy marked.

Each chart reads one results file (``CHARTS``), so every point shares that file's baseline and run; the bars
are the speedup's range over the run's alternating rounds. Written as SVG to ``docs/charts/MODEL.svg``, shown on
the results page and in the README. The SVG is deterministic for one matplotlib version; ``--check`` compares
it only when the file was drawn by the installed version (the version is in its metadata).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

# model -> (results file, field holding its rows, what the speedup is against)
CHARTS = {
    "digits": ("accelerators_digits", "configs", "DDIM 50, guidance 1, 500 images"),
    "digits-sd": ("digits_sd", "configs", "dpm++2m 20, 500 images"),
    "digits-flow": ("flow_caching", "rows", "flow Euler 28, guidance 1.5, 100 images, seed 1"),
    "moving-digits": ("video_caching", "rows", "UniPC 50, guidance 1.5, 100 clips, seed 1"),
}
CREATOR = re.compile(r"Matplotlib v([\w.+-]+)")


def chart_paths(docs: Path) -> dict[str, Path]:
    return {model: docs / "charts" / f"{model}.svg" for model in CHARTS}


def points(d: dict, field: str) -> list[dict]:
    rows = [r for r in d.get(field, []) if isinstance(r, dict) and r.get("fd") is not None]
    return [r for r in rows if r.get("speedup", r.get("cpu_speedup")) is not None]


def draw(model: str, d: dict) -> str:
    """The chart of ``model`` as SVG text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, field, baseline = CHARTS[model]
    rows = points(d, field)
    plt.rcParams["svg.hashsalt"] = "fastdiff"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in rows:
        key = "speedup" if r.get("speedup") is not None else "cpu_speedup"
        y, low, high = r[key], r.get(f"{key}_min", r[key]), r.get(f"{key}_max", r[key])
        accuracy = r.get("accuracy")
        ax.errorbar(r["fd"], y, yerr=[[y - low], [high - y]], fmt="o", color=_color(accuracy), capsize=3)
        label = r.get("name", "?") + (f" ({100 * accuracy:.1f}%)" if accuracy is not None else "")
        ax.annotate(label, (r["fd"], y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xlabel("FD (lower is better)")
    ax.set_ylabel(f"speedup vs {baseline.split(',')[0]}")
    ax.set_title(f"{model}: speedup vs {baseline}; bars: range over rounds", fontsize=8)
    ax.grid(alpha=0.3)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


def _color(accuracy: Any) -> str:
    if accuracy is None:
        return "gray"
    return "tab:green" if accuracy >= 0.98 else "tab:orange" if accuracy >= 0.95 else "tab:red"


def expected(results: dict[str, Any], docs: Path) -> dict[Path, str]:
    """Each chart whose results file exists, as it should be on disk."""
    paths = {model: path for model, path in chart_paths(docs).items() if CHARTS[model][0] in results}
    return {path: draw(model, results[CHARTS[model][0]]) for model, path in paths.items()}


def comparable(on_disk: str) -> bool:
    """Whether an SVG on disk was drawn by the installed matplotlib (else --check cannot compare it)."""
    import matplotlib

    found = CREATOR.search(on_disk)
    return found is not None and found.group(1) == matplotlib.__version__


def markdown(docs_prefix: str, results: dict[str, Any]) -> str:
    """The charts as markdown images (those whose results file exists)."""
    return "\n".join(
        f"![{model}: speedup against FD]({docs_prefix}charts/{model}.svg)"
        for model, (stem, _, _) in CHARTS.items()
        if stem in results
    )
