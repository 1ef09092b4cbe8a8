"""The notebooks in notebooks/ run top to bottom without an error (nbclient, the python3 kernel of this venv:
jupyter_client starts it with this interpreter), at their CI sizes; outputs stay stripped in git.

Full-size sweeps are the same notebooks with ``FASTDIFF_NOTEBOOK_FULL=1`` in the environment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# measured at CI size on the 2-core machine: > 20 s is marked slow; the sweeps (40-45 s each) run in
# `make test-full`, the quick start and the results page in `make test`
SLOW = {"01_quickstart", "02_sampler_sweep", "03_accelerator_sweep", "04_autotune"}
FULL = {"02_sampler_sweep", "03_accelerator_sweep", "04_autotune"}
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


def test_the_five_notebooks_exist_with_stripped_outputs():
    assert NAMES[:5] == [
        "01_quickstart",
        "02_sampler_sweep",
        "03_accelerator_sweep",
        "04_autotune",
        "05_results",
    ]
    for name in NAMES:
        book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name}: outputs not stripped"
        assert any("parameters" in c.metadata.get("tags", []) for c in code), f"{name}: no parameters cell"


def _marks(name: str) -> list:
    return [m for m, on in ((pytest.mark.slow, name in SLOW), (pytest.mark.full, name in FULL)) if on]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in NAMES])
def test_notebook_runs(name, tmp_path):
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    env = {
        "FASTDIFF_NOTEBOOK_FULL": "0",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "FASTDIFF_CACHE": str(tmp_path / "cache"),
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(
            book, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(NOTEBOOKS)}}
        )
        start = time.perf_counter()
        client.execute()  # raises CellExecutionError on any error
        seconds = time.perf_counter() - start
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    figures = sum(1 for c in code for o in c.outputs if "image/png" in o.get("data", {}))
    assert figures >= 1, f"{name}: no figure was drawn"
    assert seconds < 180, f"{name} took {seconds:.0f} s (limit 3 minutes at CI size)"
    print(f"{name}: {seconds:.1f} s, {figures} figures, python {sys.executable}")
