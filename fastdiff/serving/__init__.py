"""An HTTP service over a FastPipeline: dynamic batching, per-request acceleration profiles, backpressure.

``fastdiff serve MODEL --profile NAME=SPECS ...`` runs it (``--ray --replicas N`` on Ray Serve); see
docs/serving.md. Modules: ``schemas`` (request validation), ``batcher`` (dynamic batching), ``engine``
(profiles and per-image seeds on the pipeline), ``metrics`` (Prometheus), ``app`` (FastAPI + uvicorn),
``ray_app`` (Ray Serve deployment). ``stages`` (``StagePipeline``, docs/stages.md) streams requests through text
encoder, denoiser and VAE decoder on separate worker processes, for throughput without a server.

Example::

    from fastdiff.serving import Engine, ServeConfig, create_app, serve
    from fastdiff.zoo.shipped import install_digits

    engine = Engine.load(install_digits("/tmp/digits"), {"fast": "scheduler(name=dpm++2m,steps=10)"})
    serve(create_app(engine, ServeConfig(max_batch=16, max_queue=64)), host="127.0.0.1", port=8000)
"""

from fastdiff.serving.app import ServeConfig, create_app, serve
from fastdiff.serving.batcher import Batcher, QueueFull
from fastdiff.serving.engine import Engine
from fastdiff.serving.schemas import Limits

__all__ = ["Batcher", "Engine", "Limits", "QueueFull", "ServeConfig", "create_app", "serve"]
