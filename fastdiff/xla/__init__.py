"""Inference on torch-xla devices (TPUs; the XLA CPU backend for tests): placement and metrics (the timed
driver behind ``fastdiff tpu-infer`` is ``fastdiff.cli.tpu_infer``).

torch-xla pins its own torch (torch-xla 2.9.0 needs torch 2.9.0), so it lives in its own virtual environment
(``make test-xla`` makes ``.venv-xla``); nothing here imports torch_xla until a device is asked for.

Example::

    from fastdiff import FastPipeline
    fp = FastPipeline.from_pretrained("path/to/pipeline", device="xla",
                                      accelerators="scheduler(name=dpm++2m,steps=20);deepcache(interval=3)")
    images = fp(prompt="a fox", output_type="np").images

See docs/xla.md.
"""

from fastdiff.xla.device import is_xla, require_torch_xla, sync, xla_device

__all__ = ["is_xla", "require_torch_xla", "sync", "xla_device"]
