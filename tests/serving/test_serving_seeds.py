"""Reproducible by seed: ``Engine(exact_seeds=True)`` gives a request the same PNG pixels alone or queued with
others (bit for bit); without it, batching changes an image by at most 1/255 in a few values (a stated bound,
not equality). Engines are called directly, and through the real ``Batcher`` the server uses (no HTTP).
Figures: benchmarks/seed_repro.py, docs/serving.md "Reproducible by seed"."""

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from fastdiff.serving.batcher import Batcher
from fastdiff.serving.engine import Engine
from fastdiff.zoo import build
from fastdiff.zoo.shipped import install_digits

TEXT = {"a": "scheduler(name=dpm++2m,steps=4)"}
DIGITS = {"fast": "scheduler(name=dpm++2m,steps=10)"}
SUBJECTS = ("a red fox", "a blue car", "a green tree", "a yellow house", "a white cat", "an old boat")


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


def seeds_of(requests) -> list[list[int]]:
    return [[r.seed + k for k in range(r.count)] for r in requests]


def alone(engine, requests) -> list[list[np.ndarray]]:
    """Each request in a pipeline call of its own: its images."""
    return [[pixels(p) for p in engine.generate_one(r)[0]["pngs"]] for r in requests]


def queued(engine, requests, max_batch=8) -> tuple[list[list[np.ndarray]], list[int]]:
    """The requests submitted at once to the server's Batcher under ``engine.batch_key``: their images, and
    the number of requests in each batch it ran."""
    batches = []

    def run_batch(jobs):
        batches.append(len(jobs))
        payloads = [job.payload for job in jobs]
        return engine.generate([p["request"] for p in payloads], [p["seeds"] for p in payloads])

    async def main():
        batcher = Batcher(run_batch, max_batch=max_batch, max_wait_s=0.05, max_queue=64)
        worker = asyncio.create_task(batcher.run())
        jobs = [
            batcher.submit(engine.batch_key(r), {"request": r, "seeds": s}, r.count)
            for r, s in zip(requests, seeds_of(requests))
        ]
        results = await asyncio.gather(*(job.future for job in jobs))
        await batcher.stop()
        await worker
        batcher.close()
        return results

    results = asyncio.run(main())
    return [[pixels(p) for p in result["pngs"]] for result in results], batches


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return build("tiny-sd", tmp_path_factory.mktemp("tiny-sd"), size="test")


def text_requests(engine, count=1):
    # On the machine this was written on (1 thread), 4 of these 8 differ from alone when run in one call of 8
    # without exact_seeds (1/255 in 1 or 2 values each): the exact test below is not vacuous there.
    Request = engine.request_model()
    return [
        Request(
            prompt=f"{SUBJECTS[i % 6]} {i}", seed=200 + i, count=count, negative_prompt="blurry" if i % 2 else None
        )
        for i in range(16, 24)
    ]


@pytest.mark.timeout(120)
def test_exact_seeds_text_model_alone_equals_queued_bit_for_bit(text_model):
    engine = Engine.load(text_model, TEXT, exact_seeds=True)
    requests = text_requests(engine)
    keys = [engine.batch_key(r) for r in requests]
    assert len(set(keys)) == len(requests)  # never batched together ...
    assert len({engine.call_settings(r) for r in requests}) == 1  # ... though they could share a call
    solo = alone(engine, requests)
    images, batches = queued(engine, requests)
    assert batches == [1] * len(requests)
    for a, b in zip(solo, images, strict=True):
        assert np.array_equal(a[0], b[0])
    # a direct caller handing the engine several requests gets the same: one call per request
    results = engine.generate(requests, seeds_of(requests))
    assert [r["batch_size"] for r in results] == [1] * len(requests)
    for a, result in zip(solo, results, strict=True):
        assert np.array_equal(a[0], pixels(result["pngs"][0]))
    # count > 1: the request's own images run together, the same whatever is queued with it
    many = engine.request_model()(prompt="a white cat 16", seed=216, count=3)
    [solo_many] = alone(engine, [many])
    images, batches = queued(engine, [requests[1], many, *requests[2:5]])
    assert batches == [1] * 5
    assert all(np.array_equal(a, b) for a, b in zip(solo_many, images[1], strict=True))


@pytest.mark.timeout(120)
def test_batched_without_exact_seeds_stays_within_one_level(text_model):
    engine = Engine.load(text_model, TEXT)
    requests = text_requests(engine)
    assert len({engine.batch_key(r) for r in requests}) == 1
    solo = alone(engine, requests)
    results = engine.generate(requests, seeds_of(requests))  # one call of 8, as the batcher makes it
    assert [r["batch_size"] for r in results] == [8] * 8
    diff = np.stack([np.abs(a[0] - pixels(r["pngs"][0])) for a, r in zip(solo, results, strict=True)])
    # Stated bound (not equality): at most 1/255, on at most 0.1% of the values (measured here: 1/255 on 5 of
    # 24576 values; benchmarks/seed_repro.py for 32 requests).
    assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3, (diff.max(), int((diff > 0).sum()))
    # The count of a request is part of its composition: image k of a count-3 request against its seed run
    # alone with count 1 is within the same bound (exact only for the same request, seed and count; measured
    # here: image 0 differs by 1/255 in 2 values).
    many = engine.request_model()(prompt="a white cat 16", seed=216, count=3)
    [together] = alone(engine, [many])
    singles = [alone(engine, [many.model_copy(update={"seed": s, "count": 1})])[0][0] for s in seeds_of([many])[0]]
    diff = np.stack([np.abs(a - b) for a, b in zip(together, singles, strict=True)])
    assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3, (diff.max(), int((diff > 0).sum()))


@pytest.mark.timeout(120)
def test_digits_exact_seeds_and_batched(tmp_path):
    model = install_digits(tmp_path / "digits")
    exact, plain = Engine.load(model, DIGITS, exact_seeds=True), Engine.load(model, DIGITS)
    Request = exact.request_model()
    target = Request(label=4, seed=1234, count=2)
    others = [Request(label=i, seed=i) for i in range(6)]
    [solo] = alone(exact, [target])
    images, batches = queued(exact, [*others[:3], target, *others[3:]])
    assert batches == [1] * 7
    assert all(np.array_equal(a, b) for a, b in zip(solo, images[3], strict=True))
    # without exact_seeds the 7 requests (8 images) share one call: within one level of alone (measured: equal)
    images, batches = queued(plain, [*others[:3], target, *others[3:]], max_batch=8)
    assert batches == [7]
    diff = np.stack([np.abs(a - b) for a, b in zip(solo, images[3], strict=True)])
    assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3


def test_cli_and_ray_replica_pass_exact_seeds_to_the_engine(monkeypatch, tmp_path):
    import fastdiff.serving as serving
    from fastdiff.cli.main import build_parser

    made = {}
    monkeypatch.setattr(serving, "create_app", lambda engine, config: made.update(engine=engine, config=config))
    monkeypatch.setattr(serving, "serve", lambda app, **kw: None)
    model = str(install_digits(tmp_path / "digits"))
    for flags, exact, wait in (
        ([], False, 20.0),
        (["--exact-seeds"], True, 0.0),
        (["--exact-seeds", "--max-wait-ms", "5"], True, 5.0),
    ):
        args = build_parser().parse_args(["serve", model, "--threads", "1", *flags])
        args.func(args)
        assert made["engine"].exact_seeds is exact and made["config"].max_wait_ms == wait
    # and a Ray Serve replica builds its engine with it (the app itself, without starting Ray)
    import fastdiff.serving.app as app_module
    from fastdiff.serving.ray_app import FastdiffReplica

    made.clear()
    monkeypatch.setattr(app_module, "create_app", lambda engine, config: made.update(engine=engine))
    FastdiffReplica(model, {"default": ""}, serving.ServeConfig(), 1, True)  # builds its app at once
    assert made["engine"].exact_seeds is True
