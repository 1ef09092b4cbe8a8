"""``fastdiff serve``: an HTTP service over a model with dynamic batching and named acceleration profiles.

Example::

    fastdiff serve digits --profile fast="scheduler(name=dpm++2m,steps=10)" \\
        --profile cached="scheduler(name=dpm++2m,steps=20);deepcache(interval=2)" --max-batch 16
    curl -s localhost:8000/v1/generate -H 'Content-Type: application/json' -d '{"label": 3, "profile": "fast"}'
    fastdiff serve digits --ray --replicas 2 --ray-dir out/ray   # the same app on Ray Serve
    fastdiff serve digits --exact-seeds   # one pipeline call per request: bit-identical images by seed

Registered by ``fastdiff.cli.main`` through ``register(subparsers)``; ``run(args)`` does the work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fastdiff.cli.args import (
    NON_NEGATIVE_FLOAT,
    POSITIVE,
    POSITIVE_FLOAT,
    IntRange,
    existing_file,
    named_specs,
)


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to ``subparsers`` (from ``parser.add_subparsers``)."""
    p = subparsers.add_parser("serve", help="HTTP service: dynamic batching, per-request profiles, metrics")
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME=SPECS",
        type=named_specs,
        help="a named accelerator set clients choose by name (repeatable; the first is the default)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=IntRange(0, 65535), default=8000)
    p.add_argument("--max-batch", type=POSITIVE, default=8, help="images per pipeline call")
    p.add_argument(
        "--max-wait-ms",
        type=NON_NEGATIVE_FLOAT,
        default=None,
        help="how long a batch waits to fill (default 20; 0 with --exact-seeds, where no batch can fill)",
    )
    p.add_argument(
        "--exact-seeds",
        action="store_true",
        help="run every request in a pipeline call of its own: its images are bit-identical whatever else is "
        "queued, at the cost of batching (docs/serving.md, 'Reproducible by seed')",
    )
    p.add_argument("--max-queue", type=POSITIVE, default=64, help="waiting requests before 429")
    p.add_argument("--timeout-s", type=POSITIVE_FLOAT, default=120.0, help="504 past this, and the work is dropped")
    p.add_argument("--token-file", type=existing_file, help="file holding the bearer token clients must send")
    p.add_argument("--max-steps", type=POSITIVE, default=200)
    p.add_argument("--max-count", type=POSITIVE, default=8, help="images per request")
    p.add_argument("--max-side", type=POSITIVE, default=1024, help="largest width/height")
    p.add_argument("--threads", type=POSITIVE, default=1, help="torch threads (per replica)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--ray", action="store_true", help="run on Ray Serve (local Ray, loopback)")
    p.add_argument("--replicas", type=POSITIVE, default=2, help="Ray Serve replicas (with --ray)")
    p.add_argument("--ray-dir", default="/tmp/fastdiff-ray", help="Ray's temp files (with --ray)")
    p.set_defaults(func=run)
    return p


def parse_profiles(items: list[str]) -> dict[str, str]:
    """``["fast=scheduler(...)", ...]`` -> ``{"fast": "scheduler(...)"}``; none -> ``{"default": ""}``."""
    profiles: dict[str, str] = {}
    for item in items:
        name, sep, specs = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--profile expects NAME=SPECS, got {item!r}")
        if name in profiles:
            raise ValueError(f"--profile {name!r} is given twice")
        profiles[name] = specs.strip()
    return profiles or {"default": ""}


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"--token-file {path!r} is empty")
    return token


def run(args) -> None:
    from fastdiff.cli.resolve import resolve_model
    from fastdiff.core.optional import require

    for module in ("fastapi", "uvicorn", "prometheus_client") + (("ray",) if args.ray else ()):
        require(module, "fastdiff serve")
    from fastdiff.serving import Limits, ServeConfig

    profiles = parse_profiles(args.profile)
    limits = Limits(max_steps=args.max_steps, max_count=args.max_count, max_side=args.max_side)
    max_wait_ms = args.max_wait_ms if args.max_wait_ms is not None else (0.0 if args.exact_seeds else 20.0)
    config = ServeConfig(
        max_batch=args.max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=args.max_queue,
        timeout_s=args.timeout_s,
        token=read_token(args.token_file),
        limits=limits,
    )
    model_dir = resolve_model(args.model, args.size)
    if args.ray:
        from fastdiff.serving.ray_app import run_ray

        run_ray(
            model_dir,
            profiles,
            config,
            replicas=args.replicas,
            host=args.host,
            port=args.port,
            temp_dir=args.ray_dir,
            threads=args.threads,
            exact_seeds=args.exact_seeds,
        )
        return
    import torch

    from fastdiff.serving import Engine, create_app, serve

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.load(model_dir, profiles, limits, exact_seeds=args.exact_seeds)
    print(f"profiles: {engine.profiles}" + (" (exact seeds)" if args.exact_seeds else ""), file=sys.stderr)
    serve(create_app(engine, config), host=args.host, port=args.port, log_level=args.log_level)
