"""The same app as a Ray Serve deployment with N replicas: Ray's proxy routes (and can autoscale); each
replica loads the pipeline and runs ``create_app`` with its own batcher and queue.

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
import signal
import threading
from pathlib import Path

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


class FastdiffReplica:
    """One replica: builds its app (and loads its pipeline) when Ray Serve asks for it."""

    def __init__(
        self, model_dir: str, profiles: dict[str, str], config, threads: int | None, exact_seeds: bool = False
    ):
        self.model_dir, self.profiles, self.config, self.threads = model_dir, profiles, config, threads
        self.exact_seeds = exact_seeds

    def __serve_build_asgi_app__(self):
        import torch

        from fastdiff.serving.app import create_app
        from fastdiff.serving.engine import Engine

        if self.threads:
            torch.set_num_threads(self.threads)
        engine = Engine.load(self.model_dir, self.profiles, self.config.limits, exact_seeds=self.exact_seeds)
        return create_app(engine, self.config)


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
    ingress = serve.ingress()(FastdiffReplica)
    deployment = serve.deployment(
        ingress,
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
        raise ValueError(
            f"temp_dir {str(temp)!r} is too long for Ray's sockets; use a path under 60 characters"
        )
    temp.mkdir(parents=True, exist_ok=True)
    ray.init(
        _temp_dir=str(temp), include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
        runtime_env={"env_vars": dict(RAY_ENV)},
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own handlers
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(
            build_deployment(model_dir, profiles, config, replicas, threads, exact_seeds),
            name="fastdiff",
            route_prefix="/",
        )
        print(f"fastdiff on Ray Serve: {replicas} replicas at http://{host}:{port}", flush=True)
        if ready is not None:
            ready.set()
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
