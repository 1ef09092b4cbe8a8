"""The same app as a Ray Serve deployment with N replicas: each replica loads the pipeline and runs
``create_app`` with its own batcher and queue; an HTTP gateway in the driver (uvicorn) forwards every request
to a replica through a Ray Serve handle (Ray routes it) and turns a replica that died mid-request into a 503
with Retry-After and a request id (Ray's own HTTP proxy answers that with a bare text 500).

Ray is started locally on loopback with ``RAY_AUTH_MODE=disabled``, usage stats off and its temp files under
``temp_dir`` (not the home directory); the dashboard is off.

Example (``fastdiff serve digits --ray --replicas 2 --profile fast=...`` does the same)::

    from fastdiff.serving import ServeConfig
    from fastdiff.serving.ray_app import run_ray

    run_ray("/tmp/digits", {"fast": "scheduler(name=dpm++2m,steps=10)"}, ServeConfig(max_batch=16),
            replicas=2, port=8000, temp_dir="/tmp/fastdiff-ray")  # blocks until SIGINT/SIGTERM
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from fastapi import FastAPI, Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import Response

from fastdiff.serving.app import serve as serve_http
from fastdiff.serving.batcher import WorkerStopped

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class FastdiffReplica:
    """One replica: builds its app (and loads its pipeline) and answers the gateway's requests through it."""

    def __init__(
        self, model_dir: str, profiles: dict[str, str], config, threads: int | None, exact_seeds: bool = False
    ):
        self.model_dir, self.profiles, self.config, self.threads = model_dir, profiles, config, threads
        self.exact_seeds = exact_seeds
        self._app, self._lifespan = self.build_app(), None

    def build_app(self):
        import torch

        from fastdiff.serving.app import create_app
        from fastdiff.serving.engine import Engine

        if self.threads:
            torch.set_num_threads(self.threads)
        engine = Engine.load(self.model_dir, self.profiles, self.config.limits, exact_seeds=self.exact_seeds)
        return create_app(engine, self.config)

    async def forward(self, method: str, path: str, query: str, headers: list, body: bytes) -> tuple:
        """One HTTP request through this replica's app (its batcher, limits and errors): (status, headers, body)."""
        import httpx

        if self._lifespan is None:  # the app's lifespan (its batch worker) starts in the replica's event loop
            self._lifespan = self._app.router.lifespan_context(self._app)
            await self._lifespan.__aenter__()
        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=None) as client:
            reply = await client.request(method, path, params=query, headers=headers, content=body)
        return reply.status_code, list(reply.headers.items()), reply.content


def build_deployment(
    model_dir,
    profiles: dict[str, str],
    config,
    replicas: int = 2,
    threads: int | None = 1,
    exact_seeds: bool = False,
):
    """A bound Ray Serve application of ``replicas`` copies of the fastdiff app (``exact_seeds``: see Engine)."""
    from ray import serve

    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    deployment = serve.deployment(
        FastdiffReplica,
        name="fastdiff",
        num_replicas=replicas,
        # Each replica queues and refuses (429) by itself; Ray only needs to let that many requests through.
        max_ongoing_requests=config.max_queue + config.max_batch,
        ray_actor_options={"num_cpus": 0},
    )
    return deployment.bind(str(model_dir), dict(profiles), config, threads, exact_seeds)


def run_ray(
    model_dir,
    profiles: dict[str, str],
    config,
    replicas: int = 2,
    host: str = "127.0.0.1",
    port: int = 8000,
    temp_dir: str | os.PathLike = "/tmp/fastdiff-ray",
    threads: int | None = 1,
    ready: threading.Event | None = None,
    exact_seeds: bool = False,
) -> None:
    """Start Ray locally, deploy, serve on ``host:port`` until SIGINT/SIGTERM, then shut Ray down."""
    os.environ.update(RAY_ENV)
    import ray
    from ray import serve

    temp = Path(temp_dir).absolute()
    if len(str(temp)) > 60:  # Ray's unix sockets live under it; their paths have a ~107 character limit
        raise ValueError(f"temp_dir {str(temp)!r} is too long for Ray's sockets; use a path under 60 characters")
    temp.mkdir(parents=True, exist_ok=True)
    ray.init(
        _temp_dir=str(temp),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={"env_vars": dict(RAY_ENV)},
    )
    try:
        serve.start(proxy_location="Disabled")  # the gateway below is the HTTP front, not Ray's proxy
        handle = serve.run(
            build_deployment(model_dir, profiles, config, replicas, threads, exact_seeds),
            name="fastdiff",
            route_prefix=None,
        )
        print(f"fastdiff on Ray Serve: {replicas} replicas at http://{host}:{port}", flush=True)
        if ready is not None:
            ready.set()
        serve_http(gateway(handle, config), host=host, port=port)  # until SIGINT/SIGTERM, in-flight finished
    finally:
        serve.shutdown()
        ray.shutdown()


def gateway(handle, config):
    """The HTTP front of the replicas: forwards every request to one (Ray routes it) and answers a replica
    that died or cannot be reached with 503 + Retry-After and a request id, never Ray's bare 500."""
    # Ray's own proxy answers a replica that died mid-request with a bare text 500 and no way to change it.
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    from fastdiff.serving.app import _read_body
    from fastdiff.serving.errors import REQUEST_ID, failure_response, request_id

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)  # the replicas' schema is forwarded
    hop_by_hop = {"content-length", "transfer-encoding", "connection", "host"}

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    async def forward(request: Request, path: str):
        rid = request_id(request.headers.get(REQUEST_ID))
        body = await _read_body(request, config.limits.max_body_bytes)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in hop_by_hop | {"x-request-id"}]
        try:
            status, reply_headers, content = await handle.forward.remote(
                request.method, "/" + path, request.url.query, [*headers, (REQUEST_ID, rid)], body
            )
        except (RayActorError, ActorDiedError, ActorUnavailableError) as error:
            return failure_response(WorkerStopped(f"the replica serving it stopped ({type(error).__name__})"), rid, 5)
        except Exception as error:  # noqa: BLE001 (not the client's fault: JSON with the request id)
            return failure_response(error, rid)
        kept = {k: v for k, v in reply_headers if k.lower() not in hop_by_hop}
        return Response(content, status, headers=kept)

    return app
