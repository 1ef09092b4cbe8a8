"""Compatibility cells for student / lcm-lora on SD and SDXL variants (direct calls, batch, steps, LoRA, state).

Run: .venv/bin/python benchmarks/student_cells.py   (a few minutes; not in CI: the students are trained per run)
"""

import tempfile
from pathlib import Path

import torch

from fastdiff.distill.consistency import consistency
from fastdiff.eval.compat import check_cell
from fastdiff.zoo import build
from fastdiff.zoo.tiny import make_pipeline

VARIANTS = {
    "tiny-sd": ["tiny-sd", "tiny-sd-img2img", "tiny-sd-inpaint", "tiny-sd-controlnet", "tiny-sd-adapter"],
    "tiny-sdxl": ["tiny-sdxl", "tiny-sdxl-img2img", "tiny-sdxl-controlnet"],
}


def main() -> None:
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    for base, variants in VARIANTS.items():
        teacher = build(base, root / base, size="test")
        for kind, lora in (("full", None), ("lora", 2)):
            consistency(
                teacher,
                root / f"{base}-{kind}",
                guidance_range="2",
                lora=lora,
                train_steps=2,
                batch=2,
                skip=100,
                progress=False,
            )
        for variant in variants:
            for spec in (
                f"student(path={root / (base + '-full')},steps=4)",
                f"lcm-lora(path={root / (base + '-lora')},steps=4)",
            ):
                pipe = make_pipeline(variant, "test")
                pipe.set_progress_bar_config(disable=True)
                cell = check_cell(pipe, spec, variant)
                print(variant, spec.split("(")[0], cell.status, cell.failures, cell.notes[:2], flush=True)


if __name__ == "__main__":
    main()
