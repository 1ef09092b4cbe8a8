"""Errors that are the server's fault, as JSON with a request id: every response carries ``X-Request-Id``,
and a failure's body names it too, as does the log line with its traceback (``grep`` the id).

- out of memory (``torch.OutOfMemoryError``, ``MemoryError``) and a stopped batch worker: 503 with Retry-After
  (the next try may land when memory or the worker is back);
- NaN or inf in the images (``NonFiniteOutputError``): 500 naming it (the same request fails the same way);
- anything else: 500 ``{"detail": "internal error ...", "request_id": ...}``, never a bare text body.

Example::

    from fastdiff.serving.errors import failure_response
    failure_response(MemoryError(), "3f2a...", retry_after_s=4)   # 503, Retry-After: 4
"""

from __future__ import annotations

import logging
import re
import uuid

import torch
from fastapi.responses import JSONResponse

from fastdiff.core.pipeline import NonFiniteOutputError
from fastdiff.serving.batcher import WorkerStopped

log = logging.getLogger("fastdiff.serving")
REQUEST_ID = "X-Request-Id"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id(supplied: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a short plain token (it goes into logs), else a new one."""
    if supplied and _CLIENT_ID.fullmatch(supplied):
        return supplied
    return uuid.uuid4().hex


def failure_response(error: BaseException, rid: str, retry_after_s: int = 1) -> JSONResponse:
    """The response for a generation that failed for a reason that is not the client's; logs it with ``rid``."""
    headers = {REQUEST_ID: rid}
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        log.error("request %s: out of memory: %s", rid, error)
        status, detail = 503, "out of memory while generating; retry later or ask for fewer or smaller images"
        headers["Retry-After"] = str(retry_after_s)
    elif isinstance(error, WorkerStopped):
        log.error("request %s: %s", rid, error)
        status, detail = 503, f"{error}; retry later (another replica, or this one once restarted)"
        headers["Retry-After"] = str(retry_after_s)
    elif isinstance(error, NonFiniteOutputError):
        log.error("request %s: %s", rid, error)
        status, detail = 500, "the model produced NaN or inf values for this request (not retryable as is)"
    else:
        log.error("request %s failed", rid, exc_info=(type(error), error, error.__traceback__))
        status, detail = 500, f"internal error ({type(error).__name__}); the server log has request {rid}"
    return JSONResponse({"detail": detail, "request_id": rid}, status, headers)
