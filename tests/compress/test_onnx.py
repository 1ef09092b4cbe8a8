"""export_onnx: denoiser (+ VAE decoder) to ONNX with a dynamic batch axis, checked with onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from fastdiff.compress.onnx_export import export_onnx
from fastdiff.compress.recover import compress_model
from fastdiff.zoo import build


def test_sd_denoiser_and_vae_match_torch_at_two_batch_sizes(tmp_path):
    model = build("tiny-sd", tmp_path / "tiny-sd", size="test")
    report = export_onnx(model, tmp_path / "onnx", vae=True, batches=(2, 5))
    assert json.loads((tmp_path / "onnx" / "onnx_report.json").read_text()) == report
    den = report["denoiser"]
    assert den["inputs"] == ["sample", "timestep", "encoder_hidden_states"]
    assert set(den["max_abs_error"]) == {"2", "5"} and max(den["max_abs_error"].values()) < 1e-4
    assert max(report["vae_decoder"]["max_abs_error"].values()) < 1e-4
    session = ort.InferenceSession(den["path"], providers=["CPUExecutionProvider"])
    batch_axis = {i.name: i.shape[0] for i in session.get_inputs()}
    assert batch_axis["sample"] == "batch"  # dynamic, not the traced size
    feed = {
        "sample": np.zeros((7, 4, 16, 16), np.float32),
        "timestep": np.full((7,), 10, np.int64),
        "encoder_hidden_states": np.zeros((7, 77, 32), np.float32),
    }
    feed = {i.name: feed[i.name].astype(np.float32 if "float" in i.type else np.int64) for i in session.get_inputs()}
    assert session.run(None, feed)[0].shape == (7, 4, 16, 16)


def test_pruned_model_exports(tmp_path):
    model = build("tiny-ddpm", tmp_path / "tiny-ddpm", size="test")
    compress_model(model, tmp_path / "pruned", "prune(ratio=0.5)", recover_steps=1, batch=2, progress=False)
    report = export_onnx(tmp_path / "pruned", tmp_path / "onnx")
    assert "vae_decoder" not in report and max(report["denoiser"]["max_abs_error"].values()) < 1e-4


def test_bad_arguments(tmp_path):
    model = build("tiny-ddpm", tmp_path / "tiny-ddpm", size="test")
    with pytest.raises(ValueError, match="opset must be >= 14"):
        export_onnx(model, tmp_path / "o", opset=11)
    with pytest.raises(ValueError, match="has no VAE to export; use vae=False"):
        export_onnx(model, tmp_path / "o", vae=True)
