"""Export a pipeline's denoiser (and optionally its VAE decoder) to ONNX, verified with onnxruntime.

``export_onnx(model_dir, out_dir, vae=False, opset=17)`` captures the denoiser's real inputs from a one-step
pipeline call (sample, timestep, and whatever conditioning the pipeline feeds: text states, class labels,
SDXL's added conditioning), exports with ``torch.onnx.export`` (the TorchScript exporter, ``dynamo=False``)
with a dynamic batch axis on every input, then runs the ONNX file with onnxruntime (CPU) at two batch sizes
and compares with torch. Inputs are named after the denoiser's arguments; nested ones are joined with a dot
(``added_cond_kwargs.text_embeds``); the timestep is a 1-D batch tensor. Returns (and writes to
``out_dir/onnx_report.json``) the files and the max abs errors per batch size.

Example::

    from fastdiff.compress.onnx_export import export_onnx
    from fastdiff.zoo import build
    report = export_onnx(build("tiny-sd", "/tmp/tiny-sd"), "/tmp/tiny-sd-onnx", vae=True)
    print(report["denoiser"]["max_abs_error"])   # {"2": 1e-6, "5": 1e-6}
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn


class _Flat(nn.Module):
    """Calls ``module`` with flat tensor arguments named in ``names`` (a dot means a nested dict entry)."""

    def __init__(self, module: nn.Module, names: list[str]):
        super().__init__()
        self.module, self.names = module, names

    def forward(self, *tensors):
        kwargs: dict = {}
        for name, value in zip(self.names, tensors):
            outer, _, inner = name.partition(".")
            if inner:
                kwargs.setdefault(outer, {})[inner] = value
            else:
                kwargs[outer] = value
        return self.module(**kwargs, return_dict=False)[0]


class _Decode(nn.Module):
    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, latents):
        return self.vae.decode(latents, return_dict=False)[0]


def _flatten(inputs: dict) -> dict[str, torch.Tensor]:
    flat = {}
    for key, value in inputs.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, torch.Tensor)})
        elif isinstance(value, torch.Tensor):
            flat[key] = value
    return flat


def _at_batch(flat: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
    """Every input repeated/cut to ``batch`` along its first axis."""
    out = {}
    for name, value in flat.items():
        reps = -(-batch // value.shape[0])
        out[name] = value.repeat(reps, *[1] * (value.dim() - 1))[:batch]
    return out


def _export_and_check(module, flat, path: Path, opset: int, batches: tuple[int, int]) -> dict:
    import onnxruntime as ort

    names = list(flat)
    module = module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks traced as constants: batch-free
        torch.onnx.export(
            module,
            tuple(flat.values()),
            str(path),
            input_names=names,
            output_names=["output"],
            dynamic_axes={n: {0: "batch"} for n in names + ["output"]},
            opset_version=opset,
            dynamo=False,
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed_names = {i.name for i in session.get_inputs()}  # the exporter drops inputs the graph never reads
    errors = {}
    for batch in batches:
        inputs = _at_batch(flat, batch)
        with torch.no_grad():
            want = module(*inputs.values()).float().numpy()
        got = session.run(None, {n: v.numpy() for n, v in inputs.items() if n in feed_names})[0]
        if got.shape != want.shape:
            raise RuntimeError(f"onnxruntime returned {got.shape} for batch {batch}, torch {want.shape}")
        errors[str(batch)] = float(abs(got - want).max())
    return {"path": str(path), "inputs": names, "max_abs_error": errors}


def export_onnx(model_dir, out_dir, vae: bool = False, opset: int = 17, batches: tuple[int, int] = (2, 5)) -> dict:
    """Export ``model_dir``'s denoiser (and VAE decoder if ``vae``) to ``out_dir``; return max abs errors."""
    from fastdiff.compress.recover import capture_inputs, sample_key
    from fastdiff.core.pipeline import FastPipeline

    if opset < 14:
        raise ValueError(f"opset must be >= 14 (scaled dot-product attention), got {opset}")
    if len(batches) != 2 or min(batches) < 1:
        raise ValueError(f"batches must be two positive batch sizes, got {batches}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fp = FastPipeline.from_pretrained(model_dir)
    if vae and getattr(fp.pipe, "vae", None) is None:
        raise ValueError(f"{type(fp.pipe).__name__} has no VAE to export; use vae=False")
    fp.pipe.set_progress_bar_config(disable=True)
    inputs = capture_inputs(fp, batch=1)
    denoiser = fp.denoiser
    pipe = fp.unwrap()  # the exported graph must not contain the wrapper's hooks
    flat = _flatten(inputs)
    sample = flat[sample_key(inputs)]
    flat["timestep"] = flat["timestep"].reshape(-1).expand(sample.shape[0]).clone()
    report = {"model": str(model_dir), "opset": opset, "torch": torch.__version__}
    report["denoiser"] = _export_and_check(_Flat(denoiser, list(flat)), flat, out / "denoiser.onnx", opset, batches)
    if vae:
        decoder = pipe.vae
        latents = torch.randn(1, *sample.shape[1:], generator=torch.Generator().manual_seed(0))
        latents = latents[:, : decoder.config.latent_channels]
        report["vae_decoder"] = _export_and_check(
            _Decode(decoder), {"latents": latents}, out / "vae_decoder.onnx", opset, batches
        )
    (out / "onnx_report.json").write_text(json.dumps(report, indent=2))
    return report
