"""The torch-xla device (a TPU, or the XLA CPU backend with ``PJRT_DEVICE=CPU``) and its step boundary.

In core because ``FastPipeline`` places pipelines and ends steps with it; ``fastdiff.xla`` re-exports it.

``FastPipeline.from_pretrained(path, device="xla")`` and ``fp.to("xla")`` come here for the device;
``FastPipeline.__call__`` calls :func:`sync` after every scheduler step, so each denoising step is one lazy
graph that XLA compiles once per shape and then only executes.

Example (in ``.venv-xla``: ``make test-xla`` makes it)::

    PJRT_DEVICE=CPU .venv-xla/bin/python -c "from fastdiff.core.device import xla_device; print(xla_device())"
"""

from __future__ import annotations

import torch

INSTALL_HINT = (
    "install it beside its torch: pip install torch==2.9.0 torch-xla==2.9.0 (TPU VMs: "
    "pip install torch==2.9.0 'torch-xla[tpu]==2.9.0'), or run `make test-xla`, which makes .venv-xla"
)


def require_torch_xla():
    """The ``torch_xla`` module, or an ImportError that says how to install it."""
    try:
        import torch_xla
    except ImportError as error:
        raise ImportError(f"device 'xla' needs torch-xla, which is not installed here; {INSTALL_HINT}") from error
    return torch_xla


def xla_device(device="xla") -> torch.device:
    """The torch-xla device for "xla" (the current one) or "xla:N"; PJRT_DEVICE picks the backend (TPU, CPU)."""
    torch_xla = require_torch_xla()
    _, _, index = str(device).partition(":")
    if not index:
        return torch_xla.device()
    if not index.isdigit():
        raise ValueError(f"device {device!r}: expected 'xla' or 'xla:N' with N a device index")
    return torch_xla.device(int(index))


def is_xla(device) -> bool:
    return getattr(device, "type", str(device).split(":")[0]) == "xla"


def sync() -> None:
    """Cut the pending lazy graph and run it (``torch_xla.sync``, formerly ``xm.mark_step``)."""
    require_torch_xla().sync()
