"""The torch-xla device and its step boundary: ``fastdiff.core.device``, which ``FastPipeline`` uses, re-exported.

Example (in ``.venv-xla``: ``make test-xla`` makes it)::

    PJRT_DEVICE=CPU .venv-xla/bin/python -c "from fastdiff.xla.device import xla_device; print(xla_device())"
"""

from fastdiff.core.device import INSTALL_HINT, is_xla, require_torch_xla, sync, xla_device

__all__ = ["INSTALL_HINT", "is_xla", "require_torch_xla", "sync", "xla_device"]
