"""The digits reference model shipped with the package: hash table, instant zoo build, damaged files refused."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import torch

from fastdiff import FastPipeline
from fastdiff.eval.quality import load_reference_eval
from fastdiff.zoo import build
from fastdiff.zoo.shipped import (
    DATA_DIR,
    SHIPPED,
    ShippedModelError,
    install_digits,
    is_installed,
    shipped_table,
    verify_digits,
)

WEIGHTS = "unet/diffusion_pytorch_model.safetensors"


def test_shipped_files_match_the_table_in_the_code():
    assert {WEIGHTS, "eval/classifier.pt", "eval/split.npz", "model_index.json"} <= set(SHIPPED)
    assert shipped_table(DATA_DIR) == SHIPPED
    assert sum(size for size, _ in SHIPPED.values()) < 8_000_000  # a few MB in all
    report = json.loads((DATA_DIR / "eval" / "report.json").read_text())
    assert report["train"]["steps"] == 3000 and report["seed"] == 0


def test_zoo_bench_build_copies_the_shipped_model_which_loads_and_samples(tmp_path):
    start = time.perf_counter()
    out = build("digits", tmp_path / "digits", size="bench")
    assert time.perf_counter() - start < 5.0 and is_installed(out)
    fp = FastPipeline.from_pretrained(out, accelerators="scheduler(name=dpm++2m,steps=10)")
    fp.pipe.set_progress_bar_config(disable=True)
    labels = list(range(10)) * 2
    images = fp(class_labels=labels, output_type="np", generator=torch.Generator().manual_seed(0)).images
    assert images.shape == (20, 16, 16, 1) and np.isfinite(images).all()
    evaluation = load_reference_eval(out)  # the classifier and split shipped beside the pipeline
    predicted = evaluation.classifier(torch.as_tensor(images).permute(0, 3, 1, 2)).argmax(1).numpy()
    assert (predicted == np.array(labels)).mean() >= 0.8  # trained weights, not noise


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_file_raises_a_clear_error_naming_it_and_the_rebuild_command(tmp_path, damage):
    source = shutil.copytree(DATA_DIR, tmp_path / "source")
    path = source / WEIGHTS
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-1000]))
    else:
        path.unlink()
    expected = {"flip": "is corrupt", "truncate": "truncated", "delete": "missing"}[damage]
    with pytest.raises(ShippedModelError, match=expected) as info:
        install_digits(tmp_path / "out", source=source)
    message = str(info.value)
    assert str(path) in message and "fastdiff reference build DIR" in message
    assert not (tmp_path / "out" / WEIGHTS).exists()  # nothing copied from a damaged source
    with pytest.raises(ShippedModelError):
        verify_digits(source)


def test_cli_replaces_a_stale_or_damaged_cached_copy(tmp_path, monkeypatch):
    from fastdiff.cli.main import resolve_model

    monkeypatch.setenv("FASTDIFF_CACHE", str(tmp_path))
    stale = tmp_path / "digits-bench"
    (stale / "unet").mkdir(parents=True)
    (stale / "model_index.json").write_text("{}")  # e.g. an older, time-budgeted build
    (stale / WEIGHTS).write_bytes(b"truncated")
    assert resolve_model("digits") == stale and is_installed(stale)


def test_demo_uses_the_shipped_model_and_retrain_trains_the_bench_size(tmp_path, monkeypatch):
    import fastdiff.zoo.reference as reference
    from fastdiff.cli.demo import reference_model

    monkeypatch.setenv("FASTDIFF_CACHE", str(tmp_path))
    assert reference_model() == tmp_path / "digits-bench" and is_installed(tmp_path / "digits-bench")
    calls = []
    monkeypatch.setattr(reference, "build_reference", lambda out, **options: calls.append((out, options)) or out)
    assert reference_model(retrain=True) == tmp_path / "digits-retrained"
    assert calls == [(tmp_path / "digits-retrained", reference.SIZES["bench"])]
    assert reference.SIZES["bench"]["steps"] == 3000
