"""One-step students of the shipped references, ready to try: ``fastdiff zoo build digits-onestep DIR``.

``test`` trains a small one here in about a minute (2 progressive updates from 2 steps to 1, then 4 DMD
updates, batch 8): it runs, it is not good. A trained ``bench`` build comes from ``benchmarks/onestep_digits.sh``
(progressive 16 -> 1, then ``fastdiff distill dmd``, the snapshot picked on seed 0); it is not shipped yet.
Use a student on its teacher::

    fastdiff zoo build digits T --size bench
    fastdiff zoo build digits-onestep S --size test
    fastdiff bench T --guidance 2 --config "ddim 50=scheduler(name=ddim,steps=50)" \\
        --config "one step=student(path=S,steps=1)"
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from fastdiff.zoo.registry import register_model

BUILD_COMMAND_ONESTEP = "bash benchmarks/onestep_digits.sh ROOT 2 (then ROOT/dmd-g2/steps-1)"
SIZES = {"test": {"progressive_steps": 2, "dmd_steps": 4, "batch": 8}}


def train_onestep(out_dir: str | Path, seed: int = 0, progressive_steps: int = 2, dmd_steps: int = 4,
                  batch: int = 8) -> Path:  # fmt: skip
    """A small one-step digits student at guidance 2 in ``out_dir`` (teacher: the shipped digits reference)."""
    from fastdiff.distill.dmd import dmd
    from fastdiff.distill.progressive import progressive
    from fastdiff.zoo.shipped import install_digits

    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="fastdiff-onestep-") as work:
        teacher = install_digits(Path(work) / "digits")
        progressive(teacher, Path(work) / "prog", start=2, end=1, steps_per_round=progressive_steps, batch=batch,
                    guidance=2.0, seed=seed, progress=False)  # fmt: skip
        dmd(teacher, Path(work) / "dmd", init=Path(work) / "prog" / "steps-1", guidance=2.0, train_steps=dmd_steps,
            batch=batch, seed=seed, progress=False)  # fmt: skip
        shutil.copytree(Path(work) / "dmd" / "steps-1", out, dirs_exist_ok=True)
    return out


@register_model("digits-onestep", sizes=tuple(SIZES))
def build_digits_onestep(out_dir: Path, size: str = "bench", seed: int = 0) -> None:
    from fastdiff.zoo.shipped import install_or_train

    install_or_train("digits-onestep", out_dir, size, seed, False, SIZES, train_onestep)
