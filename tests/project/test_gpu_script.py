"""benchmarks/gpu.py: its dry run on the CPU (tiny models) writes a complete JSON; its plan and targets.

The dry run is the whole script with tiny shapes, so a GPU run (minutes of a lent machine) does not fail on
something a CPU could have caught. Here it runs in bf16 only (fp16 arithmetic on a CPU takes as long again and
runs the same code) on the SD 1.5 and DiT-XL/2 shapes (SDXL's rows run the same code as SD 1.5's); ``make
gpu-dry-run`` runs every model in both dtypes, as the GPU run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu, gpu_targets  # noqa: E402

TARGET_KEYS = {"name", "value", "target", "higher_is_better"}
GOALS = {"overhead", "compile", "compile+deepcache", "cfg-interval", "fp8", "tome", "tome-vs-tomesd"}


def strict_json(text: str) -> dict:
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu") / "dry.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu.py",
            "--dry-run",
            "--dtypes",
            "bf16",
            "--models",
            "sd15,dit-xl-2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list((ROOT / "benchmarks" / "results").glob("gpu_cpu*.json")), "a dry run wrote into results/"
    return strict_json(out.read_text())


@pytest.mark.full  # 80 s; `make gpu-dry-run` runs every model in both dtypes
@pytest.mark.timeout(300)
def test_dry_run_writes_every_row_with_timing_and_quality(dry_run):
    result = dry_run
    assert result["dry_run"] and result["settings"]["steps"] == 2 and result["settings"]["rounds"] == 1
    assert result["settings"]["compile"] == "compile(backend=eager)" and not result["not_run"]
    sections = {(g["section"], g["model"], g["dtype"]) for g in result["groups"]}
    for model in ("sd15", "dit-xl-2"):
        assert ("matrix", model, "bf16") in sections
    assert [g["side"] for g in result["groups"] if g["section"] == "tome"] == [32, 48]
    assert {(r["batch"], r["config"]) for r in result["batch_table"]} == {
        (b, c) for b in (1, 2) for c in ("plain", "deepcache")
    }
    for group in result["groups"]:
        rows = {row["name"]: row for row in group["configs"]}
        assert rows["plain"]["quality"]["identical"]
        for row in rows.values():
            assert row["status"] in ("ok", "skipped"), row  # a dry run has no errors
            if row["status"] == "skipped":
                assert row["reason"] and row["seconds_median"] is None
                continue
            assert row["seconds_median"] > 0 and row["first_call_s"] > 0 and row["speedup"] > 0
            assert set(row["quality"]) == {"psnr_db", "identical", "finite", "reference", "latent_rel_err"}
            assert row["quality"]["finite"] and row["quality"]["latent_rel_err"] is not None
            assert row["quality"]["identical"] or row["quality"]["psnr_db"] > 20
        assert rows["plain"]["quality"]["latent_rel_err"] == 0.0
        if group["section"] == "tome" and group["side"] == 48:  # later groups copy the base denoiser: still acts
            assert rows["tome"]["quality"]["latent_rel_err"] > 0 and rows["tomesd"]["quality"]["latent_rel_err"] > 0
        if group["section"] == "matrix":
            assert rows["raw"]["quality"]["identical"], "the wrapper changed the images"
            assert ("fp8+compile" in rows) == (group["dtype"] == "bf16")
            if group["model"] == "dit-xl-2":
                assert "UNet" in rows["compile+deepcache"]["reason"]
    fp8 = [r for g in result["groups"] for r in g["configs"] if r["name"] == "fp8+compile"]
    assert fp8 and all(r["status"] == "skipped" for r in fp8)  # no fp8 on a CPU
    assert {t["kind"] for t in result["targets"]} == GOALS
    for target in result["targets"]:
        assert TARGET_KEYS <= set(target)
        assert (target["value"] is None) == ("skipped" in target) == (target["met"] is None)


def test_plan_of_a_full_run():
    args = gpu.parse_args(["--dry-run"])
    args.dry_run, args.batches = False, [1, 2, 4, 8]  # the full plan, without asking for CUDA
    groups = gpu.plan(args)
    matrix = [(g.model, g.dtype) for g in groups if g.section == "matrix"]
    assert matrix == [(m, d) for d in ("fp16", "bf16") for m in ("sd15", "sdxl", "dit-xl-2")]
    assert [g.side for g in groups if g.section == "tome"] == [512, 1024]
    assert [g.batch for g in groups if g.section == "batch"] == [1, 2, 4, 8]
    assert groups[0].model == "sd15" and groups[0].dtype == "fp16"
    dit = next(g for g in groups if g.model == "dit-xl-2")
    assert "compile+deepcache" in dit.skipped and "compile+deepcache" not in [c.name for c in dit.configs]


def test_targets_from_groups():
    def row(name, seconds, status="ok"):
        return {"name": name, "status": status, "seconds_median": seconds, "reason": "why"}

    matrix = {
        "section": "matrix",
        "model": "sd15",
        "dtype": "bf16",
        "side": 512,
        "paired_plain_over_raw": [1.004, 1.008],
        "configs": [
            row("raw", 1.0),
            row("plain", 1.0),
            row("compile", 0.4),
            row("compile+deepcache", 0.25),
            row("cfg-interval", 0.9),
            row("fp8+compile", None, "skipped"),
        ],
    }
    found = {t["kind"]: t for t in gpu_targets.targets([matrix])}
    assert found["overhead"]["value"] == pytest.approx(0.6) and found["overhead"]["met"]
    assert found["compile"]["value"] == pytest.approx(2.5) and found["compile"]["met"]
    assert found["compile+deepcache"]["value"] == pytest.approx(4.0) and found["compile+deepcache"]["met"] is False
    assert found["cfg-interval"]["met"] is False
    assert found["fp8"]["value"] is None and found["fp8"]["skipped"] == "why"
    assert found["tome"]["skipped"] == "not in this run"


def test_device_names_make_file_names():
    assert gpu.slug("NVIDIA H200") == "nvidia_h200"
    assert gpu.slug("NVIDIA GeForce RTX 4090 (24 GB)") == "nvidia_geforce_rtx_4090_24_gb"
