"""The HTTP app: ``POST /v1/generate`` (dynamic batching), ``GET /healthz``, ``GET /metrics``; ``serve`` runs it.

No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations at runtime.

Example (a real server on loopback; ``fastdiff serve digits --profile fast=...`` does the same)::

    from fastdiff.serving import Engine, ServeConfig, create_app, serve
    from fastdiff.zoo.shipped import install_digits

    engine = Engine.load(install_digits("/tmp/digits"), {"fast": "scheduler(name=dpm++2m,steps=10)"})
    serve(create_app(engine, ServeConfig(max_batch=16)), port=8000)
    # curl -s localhost:8000/v1/generate -d '{"label": 3, "seed": 7}' -H 'Content-Type: application/json'
"""

import asyncio
import base64
import hmac
import json
import logging
import os
import secrets
import signal
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError

from fastdiff.core.calls import CallArgumentError
from fastdiff.serving.batcher import Batcher, Job, QueueFull, WorkerStopped
from fastdiff.serving.engine import Engine
from fastdiff.serving.errors import REQUEST_ID, failure_response, request_id
from fastdiff.serving.metrics import Metrics
from fastdiff.serving.schemas import (
    MAX_SEED,
    ErrorBody,
    GenerateResponse,
    Limits,
    Timings,
    ValidationErrorBody,
)

log = logging.getLogger("fastdiff.serving")
# every status /v1/generate answers besides 200 and 422 (documented in the OpenAPI schema)
ERRORS = {
    401: "missing or wrong bearer token",
    413: "body over --max-body-bytes",
    429: "queue full (Retry-After)",
    500: "server fault, with a request id (also in the log)",
    503: "out of memory or the batch worker stopped (Retry-After)",
    504: "timed out (--timeout-s)",
}
GENERATE_RESPONSES = {
    200: {"content": {"image/png": {}}, "description": "JSON, or one PNG with Accept: image/png"},
    422: {"model": ValidationErrorBody, "description": "a field the server or the model cannot take"},
    **{code: {"model": ErrorBody, "description": text} for code, text in ERRORS.items()},
}
# the request field behind each pipeline call argument the library checks
REQUEST_FIELDS = {"num_inference_steps": "steps", "height": "height", "width": "width"}


@dataclass(frozen=True)
class ServeConfig:
    """Batching, backpressure, time limit and token of one server (the CLI's ``--max-batch`` ... flags)."""

    max_batch: int = 8
    max_wait_ms: float = 20.0
    max_queue: int = 64
    timeout_s: float = 120.0
    token: str | None = field(default=None, repr=False)
    limits: Limits = Limits()

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.token is not None and len(self.token) < 8:
            raise ValueError("the token must have at least 8 characters")


def create_app(engine: Engine, config: ServeConfig = ServeConfig()) -> FastAPI:
    """A FastAPI app serving ``engine`` under ``config``; its lifespan runs the batcher's worker."""
    metrics = Metrics()
    Request_ = engine.request_model()
    body_schema = Request_.model_json_schema()  # the body is read raw (size limit first), so declared here
    state: dict = {}

    def run_batch(jobs: list[Job]) -> list[dict]:
        payloads = [job.payload for job in jobs]
        results = engine.generate(
            [p["request"] for p in payloads],
            [p["seeds"] for p in payloads],
            lambda: all(j.dropped for j in jobs),
        )
        if results[0]["switched"]:
            metrics.switches.inc()
            metrics.switch_seconds.observe(results[0]["switch_s"])
        return results

    def on_batch(jobs: list[Job]) -> None:
        metrics.batch_size.observe(sum(job.images for job in jobs))
        metrics.queue_depth.set(state["batcher"].depth)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher = Batcher(run_batch, config.max_batch, config.max_wait_ms / 1000, config.max_queue, on_batch)
        state["batcher"] = batcher
        worker = asyncio.create_task(batcher.run())
        yield
        await batcher.stop()  # uvicorn has already waited for in-flight requests; nothing is left queued
        await asyncio.gather(worker, return_exceptions=True)  # a failed worker is reported by batcher.failure
        batcher.close()

    app = FastAPI(title="fastdiff", lifespan=lifespan, docs_url=None, redoc_url=None)

    bearer = HTTPBearer(auto_error=False, description="the server's --token-file token")

    async def authorized(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        supplied = "" if credentials is None else credentials.credentials
        if not hmac.compare_digest(supplied.encode(), config.token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(authorized)] if config.token is not None else []  # declared in the schema only when set

    @app.middleware("http")
    async def count_statuses(request: Request, call_next):
        rid = request.state.request_id = request_id(request.headers.get(REQUEST_ID))
        try:
            response = await call_next(request)
        except Exception as error:  # noqa: BLE001 (a bug: still JSON with the id, never a bare 500)
            response = failure_response(error, rid)
        response.headers[REQUEST_ID] = rid
        if request.url.path == "/v1/generate":
            metrics.requests.labels(status=str(response.status_code)).inc()
        response.headers["X-Fastdiff-Pid"] = str(os.getpid())  # which process (Ray replica) answered
        return response

    @app.get("/healthz", responses={503: {"model": ErrorBody, "description": "the batch worker stopped"}})
    async def healthz():
        batcher = state.get("batcher")
        if batcher is not None and batcher.failure is not None:
            return JSONResponse({"detail": f"failed: {batcher.failure}"}, 503)
        return {
            "status": "ok",
            "kind": engine.kind,
            "profiles": engine.profiles,
            "active_profile": engine.active,
            "queue": batcher.depth if batcher else 0,
        }

    @app.get(
        "/metrics",
        dependencies=auth,
        responses={200: {"content": {"text/plain": {}}}, 401: {"model": ErrorBody, "description": ERRORS[401]}},
    )
    async def prometheus() -> Response:
        metrics.queue_depth.set(state["batcher"].depth)
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post(
        "/v1/generate",
        dependencies=auth,
        response_model=GenerateResponse,
        responses=GENERATE_RESPONSES,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": body_schema}}}},
    )
    async def generate(request: Request):
        arrived = time.perf_counter()
        body = await _read_body(request, config.limits.max_body_bytes)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", error.start),
                        "input": None,
                        "msg": f"the body is not UTF-8 (byte {error.start}: {body[error.start : error.start + 1]!r})",
                    }
                ]
            ) from None
        try:
            req = Request_.model_validate_json(body)
        except ValidationError as error:
            # via pydantic's JSON (a NaN input becomes null): every error stays JSON-serializable
            errors = [
                {**e, "loc": ["body", *e["loc"]]}
                for e in json.loads(error.json(include_url=False), parse_constant=str)
            ]
            raise RequestValidationError(errors) from None
        png_only = "image/png" in request.headers.get("accept", "")
        if png_only and req.count != 1:
            raise RequestValidationError(
                [
                    {
                        "type": "value_error",
                        "loc": ("body", "count"),
                        "input": req.count,
                        "msg": "Accept: image/png returns one image, so count must be 1 (or ask for JSON)",
                    }
                ]
            )
        base = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED - req.count)
        seeds = [base + i for i in range(req.count)]
        batcher: Batcher = state["batcher"]
        try:
            job = batcher.submit(engine.batch_key(req), {"request": req, "seeds": seeds}, req.count)
        except QueueFull as full:
            retry = batcher.retry_after_s()
            return JSONResponse({"detail": f"queue full: {full}; retry later"}, 429, {"Retry-After": str(retry)})
        except WorkerStopped as error:
            return failure_response(error, request.state.request_id, 30)
        metrics.queue_depth.set(batcher.depth)
        remaining = config.timeout_s - (time.perf_counter() - arrived)
        try:
            result = await asyncio.wait_for(asyncio.shield(job.future), max(remaining, 0.001))
        except TimeoutError:
            job.drop()
            metrics.dropped.inc()
            return JSONResponse({"detail": f"timed out after {config.timeout_s:g} s (--timeout-s); dropped"}, 504)
        except CallArgumentError as error:  # the model or its scheduler cannot take this request's values
            field = REQUEST_FIELDS.get(error.argument, error.argument)
            raise RequestValidationError(
                [{"type": "value_error", "loc": ("body", field), "input": error.value, "msg": str(error)}]
            ) from None
        except Exception as error:  # noqa: BLE001 (not the client's fault: 500/503 with the request id)
            return failure_response(error, request.state.request_id, batcher.retry_after_s())
        total = time.perf_counter() - arrived
        metrics.latency.labels(profile=req.profile).observe(total)
        metrics.images.labels(profile=req.profile).inc(req.count)
        timings = Timings(
            queue_s=job.started - job.arrived,
            denoise_s=result["denoise_s"],
            decode_s=result["decode_s"],
            total_s=total,
        )
        if png_only:
            headers = {
                "X-Seed": str(seeds[0]),
                "X-Profile": req.profile,
                "X-Timings": timings.model_dump_json(),
            }
            return Response(result["pngs"][0], media_type="image/png", headers=headers)
        return GenerateResponse(
            images=[base64.b64encode(png).decode("ascii") for png in result["pngs"]],
            seeds=seeds,
            profile=req.profile,
            spec=result["spec"],
            batch_size=result["batch_size"],
            timings=timings,
        )

    app.state.engine, app.state.metrics, app.state.config = engine, metrics, config
    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run ``app`` under uvicorn until SIGINT/SIGTERM: stop accepting, finish in-flight requests, exit."""
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1") and app.state.config.token is None:
        log.warning("serving on %s without a token: anyone who can reach it can use it (--token-file)", host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False))
    # uvicorn handles SIGINT/SIGTERM gracefully, then re-raises the signal under the handlers it found: make
    # that handler a clean exit (status 0) once the shutdown is done.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    server.run()


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
