"""No host-device synchronisation per denoising step comes from fastdiff.

On a GPU a tensor read on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()``,
``float()``, ``int()`` of a tensor) waits for every queued kernel, so the host can no longer run ahead of the
device. A ``TorchFunctionMode`` counts those reads whose nearest caller outside torch is a fastdiff file, in
calls of 4 and of 8 steps: the counts must not grow with the steps. The CPU runs the same Python as CUDA, so
the count is the same there. Threshold caches decide on the host by design (diffusers' first-block cache
does too): they may read one value per step.
"""

import collections
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import fastdiff
from fastdiff import FastPipeline
from fastdiff.zoo.tiny import make_pipeline
from fastdiff.zoo.tiny_flow import make_flow_pipeline

PACKAGE, TORCH = os.path.dirname(fastdiff.__file__), os.path.dirname(torch.__file__)
HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class HostReads(TorchFunctionMode):
    """Counts host reads of tensors by the fastdiff line that asked for them."""

    def __init__(self):
        super().__init__()
        self.lines = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
                where = os.path.relpath(frame.f_code.co_filename, PACKAGE)
                self.lines[f"{where}:{frame.f_lineno} {func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def per_step_reads(fp, call: dict) -> dict[str, int]:
    """Reads per line that grow from a 4-step to an 8-step call, as (8-step count - 4-step count) / 4."""
    fp(**call, num_inference_steps=4)  # first call: one-off work (the step-limit check's cache)
    counts = {}
    for steps in (4, 8):
        with HostReads() as reads:
            fp(**call, num_inference_steps=steps)
        counts[steps] = reads.lines
    lines = set(counts[4]) | set(counts[8])
    return {line: (counts[8][line] - counts[4][line]) / 4 for line in lines if counts[8][line] != counts[4][line]}


SD_CALL = {"prompt": ["a cat", "a dog"], "output_type": "np"}
FLOW_CALL = {"prompt": ["a cat", "a dog"], "output_type": "np", "height": 32, "width": 32}
CASES = [  # (model, accelerators, host reads allowed per step)
    ("tiny-sd", None, 0),
    ("tiny-sd", "deepcache(interval=3)", 0),
    ("tiny-sd", "tome(ratio=0.5)", 0),
    ("tiny-sd", "cfg-interval(start=0.0,end=0.5)", 0),
    ("tiny-sd", "scheduler(name=dpm++2m)", 0),
    ("tiny-sd", "promptcache", 0),
    ("tiny-sd", "forecast(order=1,interval=2,warmup=2)", 0),
    ("tiny-sd3", None, 0),
    ("tiny-sd3", "blockcache(mode=interval,interval=2)", 0),
    ("tiny-sd3", "forecast(order=1,interval=2,warmup=2)", 0),
    ("tiny-sd3", "blockcache(mode=first-block,threshold=0.1)", 1),
    ("tiny-sd3", "blockcache(mode=teacache,threshold=0.3)", 1),
]


@pytest.mark.parametrize("model,spec,allowed", CASES)
def test_no_host_read_per_step(model, spec, allowed):
    torch.manual_seed(0)
    flow = model == "tiny-sd3"
    pipe = make_flow_pipeline(model) if flow else make_pipeline(model, "test")
    pipe.set_progress_bar_config(disable=True)
    fp = FastPipeline(pipe, accelerators=spec)
    growing = per_step_reads(fp, FLOW_CALL if flow else SD_CALL)
    assert all(v <= allowed for v in growing.values()) and sum(growing.values()) <= allowed, growing
