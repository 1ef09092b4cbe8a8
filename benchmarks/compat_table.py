"""Run the compatibility matrix (pipeline variants x every accelerator x the habits) and print the README table.

Every cell is ``fastdiff.eval.compat.check_cell`` on the zoo's test-size models, the same check that
tests/core/test_coexist.py runs. Writes benchmarks/results/compat.json and prints a markdown table.

    python benchmarks/compat_table.py [--variants tiny-sd,tiny-dit] [--accelerators deepcache,tome]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fastdiff.eval.compat import MATRIX_SPECS, check_cell, matrix_spec
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline

VARIANTS = (
    "tiny-sd",
    "tiny-sd-img2img",
    "tiny-sd-inpaint",
    "tiny-sd-controlnet",
    "tiny-sd-controlnet-img2img",
    "tiny-sd-controlnet-inpaint",
    "tiny-sd-adapter",
    "tiny-sdxl",
    "tiny-sdxl-img2img",
    "tiny-sdxl-inpaint",
    "tiny-sdxl-controlnet",
    "tiny-dit",
    "tiny-ddpm",
    "tiny-flux",
    "tiny-flux-schnell",
    "tiny-flux-img2img",
    "tiny-flux-inpaint",
    "tiny-flux-controlnet",
    "tiny-flux2",
    "tiny-flux2-klein",
    "tiny-sd3",
    "tiny-sd3-img2img",
    "tiny-sd3-controlnet",
    "tiny-sana",
    "tiny-pixart-sigma",
    "tiny-qwen-image",
    "tiny-qwen-image-img2img",
    "tiny-qwen-image-inpaint",
    "tiny-zimage",
)


def symbol(cell: dict) -> str:
    if cell["status"] == "refused":
        return "refused"
    if cell["status"] == "failed":
        return "**FAILED**"
    mark = "yes"
    if "direct call: accelerated" in cell["notes"]:
        mark += " (d)"
    if "changes the shared module: siblings see it" in cell["notes"]:
        mark += " (s)"
    return mark


def short(refusal: str) -> str:
    """The reason of a refusal, without the prefix naming spec and pipeline, up to its first aside."""
    reason = refusal.split(": ", 1)[1]
    return reason.split(" (")[0].split(";")[0]


def markdown(cells: list[dict], variants, accelerators) -> str:
    by = {(c["variant"], c["accelerator"]): c for c in cells}
    lines = ["| variant | " + " | ".join(accelerators) + " |", "|---" * (len(accelerators) + 1) + "|"]
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(symbol(by[(v, a)]) for a in accelerators) + " |")
    reasons = sorted({short(c["notes"][0]) for c in cells if c["status"] == "refused"})
    lines += ["", "Refusals (at `accelerate()`, nothing changed):"] + [f"- {r}" for r in reasons]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--accelerators", default=",".join(MATRIX_SPECS))
    parser.add_argument("--json", default="benchmarks/results/compat.json")
    parser.add_argument("--render", action="store_true", help="print the table of an existing --json file")
    args = parser.parse_args()
    if args.render:
        cells = json.loads(Path(args.json).read_text())["cells"]
        variants = list(dict.fromkeys(c["variant"] for c in cells))
        print(markdown(cells, variants, list(dict.fromkeys(c["accelerator"] for c in cells))))
        return
    torch.set_num_threads(1)
    variants, accelerators = args.variants.split(","), args.accelerators.split(",")
    cells, start = [], time.perf_counter()
    bar = tqdm(total=len(variants) * len(accelerators), desc="cells")
    for variant in variants:
        pipe = make_pipeline(variant)
        pipe.set_progress_bar_config(disable=True)
        for accelerator in accelerators:
            cell = check_cell(pipe, matrix_spec(accelerator, pipe), variant)
            cells.append(
                dict(
                    variant=variant,
                    accelerator=accelerator,
                    spec=cell.spec,
                    status=cell.status,
                    notes=cell.notes,
                    failures=cell.failures,
                )
            )
            bar.update()
    bar.close()
    result = {"seconds": round(time.perf_counter() - start, 1), "cells": cells}
    write_record(args.json, result, benchmark="compat_table", indent=1)
    print(markdown(cells, variants, accelerators))
    failed = [c for c in cells if c["status"] == "failed"]
    print(f"\n{len(cells)} cells: {len(cells) - len(failed)} ok or refused, {len(failed)} failed")


if __name__ == "__main__":
    main()
