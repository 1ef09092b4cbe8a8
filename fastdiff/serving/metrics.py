"""Prometheus metrics of one server, in its own ``CollectorRegistry`` (several servers can share a process).

Exposed at ``GET /metrics`` in Prometheus' text format by ``prometheus_client.generate_latest``.

Example::

    from fastdiff.serving.metrics import Metrics

    m = Metrics()
    m.requests.labels(status="200").inc()
    m.latency.labels(profile="fast").observe(0.12)
    print(m.render().decode())  # fastdiff_requests_total{status="200"} 1.0 ...
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Metrics:
    """Queue depth, batch sizes, latency per profile, requests by status, profile switches."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("fastdiff_queue_depth", "requests waiting for a batch", registry=r)
        self.batch_size = Histogram(
            "fastdiff_batch_size", "images per pipeline call", buckets=BATCH_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "fastdiff_request_latency_seconds",
            "arrival to response of successful requests, per profile",
            ["profile"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter("fastdiff_requests", "requests to /v1/generate by status", ["status"], registry=r)
        self.images = Counter("fastdiff_images", "images generated, per profile", ["profile"], registry=r)
        self.switches = Counter("fastdiff_profile_switches", "profile changes between batches", registry=r)
        self.switch_seconds = Histogram(
            "fastdiff_profile_switch_seconds",
            "time to remove one profile's accelerators and apply another's",
            buckets=(0.0001, 0.001, 0.01, 0.1, 1, 10),
            registry=r,
        )
        self.dropped = Counter("fastdiff_dropped", "requests whose work was dropped after their deadline", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
