"""The TPU inference driver behind ``fastdiff tpu-infer`` (registered by cli/tpu.py): warm-up calls, then timed
calls, then XLA metrics.

Shapes stay static: every call has the same batch, size and step count, so after the warm-up XLA only
executes graphs it has compiled (the metrics show ``compiles`` 0 for the timed calls). ``device="cpu"``
runs the very same calls in CPU eager mode, for comparison.

Example (``PJRT_DEVICE=CPU`` on any machine, ``PJRT_DEVICE=TPU`` on a TPU VM)::

    from fastdiff.cli.tpu_infer import report, tpu_infer
    from fastdiff.zoo.shipped import ensure_digits

    result = tpu_infer(ensure_digits("/tmp/digits"), "scheduler(name=dpm++2m,steps=20)", batch=8)
    print(report(result))
    result["s_per_image"], result["timed"]["compiles"]   # ..., 0
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fastdiff.core.pipeline import FastPipeline


def load(model, specs: str = "", device="xla", bf16: bool = False) -> FastPipeline:
    """``model`` (a pipeline directory) on ``device``, in bfloat16 if asked, with ``specs`` applied there."""
    kwargs = {"dtype": torch.bfloat16} if bf16 else {}  # diffusers 0.42 deprecates torch_dtype=
    fp = FastPipeline.from_pretrained(model, accelerators=specs or None, device=device, **kwargs)
    fp.pipe.set_progress_bar_config(disable=True)
    return fp


def call_inputs(fp: FastPipeline, batch: int, steps: int | None, guidance: float | None) -> dict[str, Any]:
    """Call arguments for ``batch`` images from the pipeline's facts; ``steps`` None keeps a preset's count."""
    from fastdiff.core.inputs import make_inputs

    if not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    call = make_inputs(fp.pipe, batch, guidance)
    if steps is not None:
        call["num_inference_steps"] = steps
    return call


def tpu_infer(
    model,
    specs: str = "",
    batch: int = 1,
    steps: int | None = None,
    bf16: bool = False,
    warmup: int = 1,
    runs: int = 3,
    seed: int = 0,
    guidance: float | None = None,
    device="xla",
    fp: FastPipeline | None = None,
) -> dict[str, Any]:
    """Warm-up and timed calls of ``model`` with ``specs`` on ``device``.

    Returns ``images`` (of the last call, numpy), ``seconds`` per timed call, ``s_per_image`` (median / batch),
    and on XLA ``warmup`` and ``timed`` metrics (compiles, compile_s, executions, execute_s). Pass ``fp`` to
    reuse a loaded pipeline (``model``, ``specs``, ``bf16`` and ``device`` are then ignored).
    """
    if warmup < 1 or runs < 1:
        raise ValueError(f"warmup and runs must be >= 1 (XLA compiles in the warm-up), got {warmup}, {runs}")
    fp = fp or load(model, specs, device, bf16)
    on_xla = fp.pipe.device.type == "xla"
    call = call_inputs(fp, batch, steps, guidance)

    def once():
        return fp(**call, output_type="np", generator=torch.Generator().manual_seed(seed)).images

    snapshot, since = _metrics(on_xla)
    before = snapshot()
    for _ in range(warmup):
        once()
    warm = since(before)
    before = snapshot()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        images = once()  # numpy output: the graphs have run and the pixels are on the host
        seconds.append(time.perf_counter() - start)
    result = {
        "device": str(fp.pipe.device),
        "specs": ";".join(map(str, fp.accelerators)),
        "batch": batch,
        "dtype": str(fp.denoiser.dtype).removeprefix("torch."),
        "seconds": seconds,
        "s_per_image": statistics.median(seconds) / batch,
        "images": images,
    }
    if on_xla:
        result.update(warmup=warm, timed=since(before))
    return result


def report(result: dict[str, Any]) -> str:
    """Lines for the terminal: s/image, and the XLA metrics of the warm-up and the timed calls."""
    from fastdiff.xla.metrics import format_metrics

    lines = [
        f"{result['specs'] or 'no accelerator'} on {result['device']} ({result['dtype']}), batch {result['batch']}: "
        f"{result['s_per_image']:.4f} s/image (median of {len(result['seconds'])} timed calls)"
    ]
    for phase in ("warmup", "timed"):
        if phase in result:
            lines.append(f"{phase:>6}: {format_metrics(result[phase])}")
    return "\n".join(lines)


def save(result: dict[str, Any], out_dir: str | Path) -> Path:
    """PNGs of the last call's images and ``metrics.json`` (everything but the pixels) into ``out_dir``."""
    import json

    from fastdiff.eval.grid import save_images

    out = Path(out_dir)
    save_images(result["images"], out)
    summary = {k: v for k, v in result.items() if k != "images"}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    return out


def _metrics(on_xla: bool):
    if not on_xla:
        return (lambda: {}), (lambda before: {})
    from fastdiff.xla.metrics import since, snapshot

    return snapshot, since
