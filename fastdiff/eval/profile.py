"""``fastdiff profile``: where a pipeline call spends its time (text encoder, denoiser, VAE, scheduler, other).

Component times come from named timing hooks (the same hook mechanism accelerators use) and a timed
``scheduler.step``; the top operators come from ``torch.profiler``.

Example::

    from fastdiff import FastPipeline
    from fastdiff.eval.profile import profile_call
    fp = FastPipeline.from_pretrained("/tmp/tiny-sd")
    split, table = profile_call(fp, {"prompt": "a cat", "num_inference_steps": 4})
"""

from __future__ import annotations

import time
from typing import Any

import torch
from diffusers.hooks import ModelHook

from fastdiff.core.hooks import install_hook
from fastdiff.core.models import TEXT_ENCODER_ATTRS


class _Timer(ModelHook):
    def __init__(self, totals: dict, key: str):
        super().__init__()
        self.totals, self.key, self.depth, self.start = totals, key, 0, 0.0

    def pre_forward(self, module, *args, **kwargs):
        if self.depth == 0:
            self.start = time.perf_counter()
        self.depth += 1
        return args, kwargs

    def post_forward(self, module, output):
        self.depth -= 1
        if self.depth == 0:
            self.totals[self.key] = self.totals.get(self.key, 0.0) + time.perf_counter() - self.start
        return output


def _components(fp) -> dict[str, list[torch.nn.Module]]:
    pipe = fp.pipe
    parts = {"text encoder": [getattr(pipe, a) for a in TEXT_ENCODER_ATTRS if getattr(pipe, a, None) is not None]}
    parts["denoiser"] = [fp.denoiser]
    vae = getattr(pipe, "vae", None)
    if vae is not None:
        parts["vae"] = [m for m in (getattr(vae, "decoder", None), getattr(vae, "post_quant_conv", None)) if m]
    return {k: v for k, v in parts.items() if v}


def profile_call(fp, call: dict[str, Any], top: int = 15) -> tuple[dict[str, float], str]:
    """Run ``fp(**call)`` under timers, then under torch.profiler; return ({component: seconds}, top-operator table)."""
    totals: dict[str, float] = {}
    handles = [
        install_hook(module, _Timer(totals, name), f"fastdiff.profile.{i}")
        for name, modules in _components(fp).items()
        for i, module in enumerate(modules)
    ]
    scheduler = fp.pipe.scheduler
    step = scheduler.step

    def timed_step(*a, **k):
        start = time.perf_counter()
        try:
            return step(*a, **k)
        finally:
            totals["scheduler"] = totals.get("scheduler", 0.0) + time.perf_counter() - start

    scheduler.step = timed_step  # instance attribute for this profile only
    try:
        start = time.perf_counter()
        fp(**call)
        total = time.perf_counter() - start
    finally:
        del scheduler.step
        for handle in handles:
            handle.remove()
    totals["other"] = max(0.0, total - sum(totals.values()))
    totals["total"] = total
    # A second call under torch.profiler, so its overhead does not distort the split above.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fp(**call)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    return totals, table


def format_split(totals: dict[str, float]) -> str:
    total = totals["total"]
    lines = [f"{'component':<14} {'seconds':>9} {'share':>7}"]
    for key, value in sorted(totals.items(), key=lambda kv: -kv[1]):
        if key != "total":
            lines.append(f"{key:<14} {value:>9.3f} {100 * value / total:>6.1f}%")
    lines.append(f"{'total':<14} {total:>9.3f} {100.0:>6.1f}%")
    return "\n".join(lines)
