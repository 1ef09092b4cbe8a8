"""The wheels work on their own: built from this tree, installed into a fresh venv, run from outside the repository.

The library's wheel is under 2 MB; the reference models' files are the fastdiff-accel-references wheel
(``references/``), installed after the test has seen the library name it when it is missing.

The fresh venv gets the wheel with ``pip install --no-deps``; torch, diffusers and the other dependencies come
from this venv's site-packages through a ``.pth`` line. A path in a ``.pth`` file is only appended to
``sys.path`` (the ``.pth`` files in it are not run), so the editable install of fastdiff here, a ``.pth`` of its
own, stays out: the test checks that ``fastdiff`` is imported from the fresh venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def run(cmd: list, cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    pytest.importorskip("build")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy, so that the build leaves no build/ or egg-info in the repository
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "fastdiff", source / "fastdiff", ignore=shutil.ignore_patterns("__pycache__"))
    # no isolation: the build backend (setuptools) comes from this venv, no download
    run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp / "dist", source],
        cwd=tmp,
    )
    shutil.copytree(
        ROOT / "references", source / "references", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            tmp / "dist",
            source / "references",
        ],
        cwd=tmp,
    )
    (wheel,) = (tmp / "dist").glob("fastdiff_accel-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], cwd=tmp)
    python = tmp / "venv" / "bin" / "python"
    # the wheel first: with the dependencies already visible, pip would see fastdiff-accel installed and skip it
    run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        cwd=tmp,
    )
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip()
    Path(site, "fastdiff_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return tmp / "venv" / "bin"


def env(tmp: Path) -> dict:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "FASTDIFF_CACHE": str(tmp / "cache"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_the_wheel_installs_and_runs(venv, tmp_path):
    outside = tmp_path  # not the repository: nothing can come from the source tree
    # where fastdiff comes from, without importing torch: find_spec does not run the package
    probe = "import importlib.metadata as m, importlib.util as u; print(u.find_spec('fastdiff').origin, m.version('fastdiff-accel'))"
    origin, version = run([venv / "python", "-c", probe], cwd=outside, env=env(tmp_path)).split()
    assert Path(origin).is_relative_to(venv.parent) and version == VERSION, (origin, version)
    assert run([venv / "fastdiff", "--version"], cwd=outside, env=env(tmp_path)).strip() == f"fastdiff-accel {VERSION}"

    # the library's wheel is small: the reference models are a distribution of their own, named when missing
    dist = venv.parent.parent / "dist"
    (library,) = dist.glob("fastdiff_accel-*.whl")
    (references,) = dist.glob("fastdiff_accel_references-*.whl")
    assert library.stat().st_size < 2 * 1024 * 1024, f"{library.name}: {library.stat().st_size} bytes"
    missing = subprocess.run(
        [venv / "fastdiff", "zoo", "build", "digits", tmp_path / "none", "--size", "bench"],
        cwd=outside,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert missing.returncode != 0 and 'pip install "fastdiff-accel[zoo]"' in missing.stderr, missing.stderr[-2000:]
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "python",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            references,
        ],
        cwd=outside,
    )

    # the shipped digits model from the references wheel: every file passes its size and sha256 check
    model = tmp_path / "digits"
    run(
        [venv / "fastdiff", "zoo", "build", "digits", model, "--size", "bench"],
        cwd=outside,
        env=env(tmp_path),
    )
    assert (model / "unet" / "diffusion_pytorch_model.safetensors").is_file()

    # a short bench on it, quality included (the classifier and split shipped beside the model)
    out = tmp_path / "bench.json"
    run(
        [
            venv / "fastdiff",
            "bench",
            model,
            "--config",
            "ddim2=scheduler(name=ddim,steps=2)",
            "--batch",
            "10",
            "--runs",
            "1",
            "--no-warmup",
            "--threads",
            "1",
            "--json",
            out,
        ],
        cwd=outside,
        env=env(tmp_path),
    )
    (row,) = json.loads(out.read_text())["configs"]
    assert row["denoiser_calls"] == 2 and 0 <= row["accuracy"] <= 1 and row["fd"] > 0
