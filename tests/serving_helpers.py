"""Real servers on free loopback ports for the serving tests (uvicorn in a thread; never a test client)."""

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from fastdiff.serving import Engine, ServeConfig, create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(model_dir, profiles, **config):
    """A real uvicorn server over a fresh Engine in a thread; yields its base URL."""
    engine = Engine.load(model_dir, profiles, config.get("limits"))
    with serving(create_app(engine, ServeConfig(**config))) as url:
        yield url


@contextmanager
def serving(app):
    """``app`` under a real uvicorn server in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        assert not thread.is_alive()
