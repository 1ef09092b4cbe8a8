"""Server faults: JSON with a request id (body, X-Request-Id, the log line with the traceback), 503 with
Retry-After for out-of-memory and a stopped batch worker, a clear 500 for NaN output. Faults are injected into a
real server over the shipped digits model (the server's error handling is what is under test)."""

import logging

import httpx
import pytest
import torch
from serving_helpers import serving

from fastdiff.serving import Engine, ServeConfig, create_app
from fastdiff.zoo.shipped import install_digits

FAST = "scheduler(name=dpm++2m,steps=4)"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return install_digits(tmp_path_factory.mktemp("digits"))


def server(digits):
    engine = Engine.load(digits, {"fast": FAST})
    return engine, create_app(engine, ServeConfig())


def failing(error):
    def generate(*args, **kwargs):
        raise error

    return generate


@pytest.mark.timeout(60)
def test_internal_error_is_json_with_the_request_id_in_body_header_and_log(digits, caplog):
    engine, app = server(digits)
    engine.generate = failing(RuntimeError("injected fault"))
    with serving(app) as url, caplog.at_level(logging.ERROR, "fastdiff.serving"):
        r = httpx.post(f"{url}/v1/generate", json={"label": 3}, headers={"X-Request-Id": "client-id-7"})
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["request_id"] == "client-id-7" == r.headers["x-request-id"]
        assert "RuntimeError" in r.json()["detail"] and "client-id-7" in r.json()["detail"]
        [record] = [rec for rec in caplog.records if "client-id-7" in rec.getMessage()]
        assert record.exc_info[0] is RuntimeError  # the traceback is in the log line with the id
        # a client id that is not a short plain token is not logged: the server makes its own
        r = httpx.post(f"{url}/v1/generate", json={"label": 3}, headers={"X-Request-Id": "a b;" * 40})
        assert r.status_code == 500 and len(r.json()["request_id"]) == 32
        assert httpx.get(f"{url}/healthz").headers["x-request-id"]  # every response has one


@pytest.mark.timeout(60)
def test_out_of_memory_is_503_with_retry_after(digits):
    engine, app = server(digits)
    engine.generate = failing(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    with serving(app) as url:
        r = httpx.post(f"{url}/v1/generate", json={"label": 3})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert "out of memory" in r.json()["detail"] and r.json()["request_id"]


@pytest.mark.timeout(60)
def test_nan_output_is_a_clear_500(digits):
    engine, app = server(digits)
    with torch.no_grad():
        next(engine.fp.denoiser.parameters()).fill_(float("nan"))  # a real NaN, found by the library's check
    with serving(app) as url:
        r = httpx.post(f"{url}/v1/generate", json={"label": 3})
        assert r.status_code == 500 and "NaN or inf" in r.json()["detail"], r.text


@pytest.mark.timeout(60)
def test_stopped_batch_worker_is_503_and_unhealthy(digits):
    engine, app = server(digits)
    with serving(app) as url:
        assert httpx.post(f"{url}/v1/generate", json={"label": 3}).status_code == 200
        app.state.metrics.batch_size = None  # the worker loop itself now fails (not a batch)
        r = httpx.post(f"{url}/v1/generate", json={"label": 3})
        assert r.status_code == 503 and "batch worker stopped" in r.json()["detail"], r.text
        assert int(r.headers["retry-after"]) >= 1
        r = httpx.post(f"{url}/v1/generate", json={"label": 4})  # refused at once, not left to time out
        assert r.status_code == 503 and "batch worker stopped" in r.json()["detail"]
        health = httpx.get(f"{url}/healthz")
        assert health.status_code == 503 and "batch worker stopped" in health.json()["detail"]


@pytest.mark.timeout(60)
def test_openapi_documents_the_body_and_every_status(digits):
    _, app = server(digits)
    with serving(app) as url:
        schema = httpx.get(f"{url}/openapi.json").json()
    post = schema["paths"]["/v1/generate"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body["additionalProperties"] is False and "label" in body["required"]
    assert {"200", "401", "413", "422", "429", "500", "503", "504"} <= set(post["responses"])
    assert "image/png" in post["responses"]["200"]["content"]
