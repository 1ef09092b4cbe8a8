"""Stage pipelining for throughput: text encoder, denoiser and VAE decoder on separate worker processes.

``StagePipeline`` streams requests (dicts of the pipeline's own call arguments) through three stages joined
by bounded queues, so that while request k denoises, request k+1 is encoded and request k-1 decoded. The
workers are started by ``fastdiff.parallel.launch.launch`` (processes in a ``torch.distributed``
group, one torch thread each; a worker that fails or dies makes it terminate the others and raise), run on a
background thread of the caller. Each worker loads the pipeline and applies the accelerators of its stages
(routed by what they declare they touch: ``text_encoder.*`` on the text stage, everything else on the
denoiser), and the stages use the pipeline's own pieces (``encode_prompt``, a call with ``prompt_embeds`` and
``output_type="latent"``, ``vae.decode`` + ``image_processor.postprocess``): the images equal those of the
same requests run one after another through ``FastPipeline`` (tests/serving/test_stages.py).

- ``devices=2``: text encoder + VAE decoder on one process, denoiser on the other.
- ``devices=3``: one process per stage.
- ``denoisers=N`` (N > 1) with ``devices=N + 1``: the text encoder and VAE decoder on one process, and the
  denoiser, the slowest stage, replicated on N processes that take requests in turn.

With one denoiser, the denoiser bounds the throughput (Amdahl): the speedup over one process is at most
total / denoiser time per request, about 1.02x at 20 guided steps; replicas lift that bound about N-fold.
Measured figures in docs/stages.md.

Example (in a script, under ``if __name__ == "__main__":``: the workers import the main module)::

    import torch
    from fastdiff.serving.stages import StagePipeline
    from fastdiff.zoo import build

    model = build("tiny-sd", "/tmp/tiny-sd", size="test")
    requests = [{"prompt": [f"a fox, take {i}"], "guidance_scale": 5.0, "output_type": "np",
                 "generator": torch.Generator().manual_seed(i)} for i in range(8)]
    with StagePipeline(model, accelerators="scheduler(name=dpm++2m,steps=4)", devices=2, queue_size=2) as sp:
        images = sp.map(requests)   # one array of images per request, in order
"""

from __future__ import annotations

import inspect
import json
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.registry import AcceleratorError
from fastdiff.parallel.launch import ParallelError
from fastdiff.serving.stage_workers import PROMPT_EMBEDS, STAGES, layout, serve

OUTPUT_TYPES = ("pil", "np", "pt", "latent")
SET_BY_STAGES = ("prompt_embeds", "negative_prompt_embeds", "return_dict")  # requests may not pass these
WAIT_S = 0.05  # how often the caller checks the workers while it waits on a queue


class StageError(ParallelError):
    """A stage worker failed, died or hung; the message names its stages. ``pids``: all ended when raised."""


class StagePipeline:
    """Text encoder, denoiser and VAE decoder of ``model`` on ``devices`` worker processes, joined by queues.

    ``denoisers``: denoiser replicas (``devices`` must then be ``denoisers + 1``).
    ``accelerators``: a spec for ``FastPipeline`` (scheduler presets, deepcache, promptcache ...; not the
    ``parallel`` kind, which needs a process group of its own). ``queue_size``: requests each queue holds
    between two stages. ``threads``: torch threads per worker. ``device``: ``"cpu"`` or ``"cuda"`` (one GPU per
    worker where there are enough, else all on the current one). ``timeout_s``: the longest wait for the
    workers to start or for the next image before the workers are ended and ``StageError`` is raised.
    Use it as a context manager (or ``start()`` / ``close()``); ``map`` and ``stream`` take the requests.
    """

    def __init__(
        self,
        model,
        accelerators=None,
        devices: int = 2,
        queue_size: int = 2,
        threads: int = 1,
        device: str = "cpu",
        timeout_s: float = 600.0,
        denoisers: int = 1,
    ):
        from fastdiff.core.spec import parse

        path = Path(model).expanduser()
        if not (path / "model_index.json").is_file():
            raise ValueError(f"model {str(model)!r} is not a diffusers pipeline directory (no model_index.json)")
        self.pipeline_class = json.loads((path / "model_index.json").read_text())["_class_name"]
        if self.pipeline_class not in PROMPT_EMBEDS:
            raise UnsupportedModelError(
                f"StagePipeline does not support {self.pipeline_class}; supported: {', '.join(sorted(PROMPT_EMBEDS))}"
            )
        _check_int("devices", devices)
        _check_int("denoisers", denoisers)
        self.layout = layout(devices, denoisers)
        _check_int("queue_size", queue_size)
        _check_int("threads", threads)
        if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_available()):
            raise ValueError(f"device must be 'cpu' or 'cuda' (with CUDA available), got {device!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        configs = parse(accelerators or [])
        refused = [str(c) for c in configs if c.kind == "parallel"]
        if refused:
            raise AcceleratorError(
                f"StagePipeline: {', '.join(refused)} needs a process group of its own and "
                "cannot run inside a stage; use it without StagePipeline"
            )
        self.model, self.specs = str(path), ";".join(map(str, configs))
        self.devices, self.queue_size, self.threads, self.device = devices, queue_size, threads, device
        self.timeout_s = float(timeout_s)
        self.pids: list[int] = []  # the worker processes by rank, once started
        self._call_arguments = _call_arguments(self.pipeline_class)
        self._thread = None
        self._error: BaseException | None = None
        self._next_index = 0

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> StagePipeline:
        """Start the workers and wait until every one has loaded the pipeline and applied its accelerators."""
        if self._thread is not None:
            raise RuntimeError("StagePipeline is already started")
        from fastdiff.parallel.launch import launch, start_context

        context = start_context()  # the queues' locks must suit how the workers start
        self._queues = [context.Queue(maxsize=self.queue_size) for _ in range(len(STAGES) + 1)]
        self._events, self._finished = context.Queue(), context.Event()
        # The process group's timeout bounds the workers' final barrier after the last image.
        args = (
            self.model,
            self.specs,
            self.device,
            self.layout,
            self._queues,
            self._events,
            self._finished,
            self.timeout_s,
        )

        def run():
            try:
                launch(serve, self.devices, *args, timeout_s=self.timeout_s + 60, threads=self.threads)
            except BaseException as error:  # reported to the caller by _check
                self._error = error

        self._thread = threading.Thread(target=run, name="fastdiff-stage-launcher", daemon=True)
        self._thread.start()
        deadline, ready = time.monotonic() + self.timeout_s, {}
        while len(ready) < self.devices:
            self._check(deadline, "start")
            try:
                _, rank, pid = self._events.get(timeout=WAIT_S)
                ready[rank] = pid
                self.pids = [ready[r] for r in sorted(ready)]
            except queue.Empty:
                pass
        return self

    def close(self) -> None:
        """End the stream: let the workers finish what they hold, then stop them. Raises StageError on failure."""
        if self._thread is None:
            return
        try:
            self._put(None)
            while self._get() is not None:
                pass
            self._finished.set()
            self._thread.join(self.timeout_s)
            self._check(time.monotonic() + 1, "close")
        finally:
            self._abort()

    def __enter__(self) -> StagePipeline:
        return self.start()

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self._abort()

    # -- requests -----------------------------------------------------------------------------------------

    def map(self, requests: Iterable[dict]) -> list:
        """The images (``output.images``) of every request, in order."""
        return list(self.stream(requests))

    def stream(self, requests: Iterable[dict]) -> Iterator:
        """Yield each request's images in order while later requests are still being encoded and denoised."""
        if self._thread is None:
            if self._error is not None:
                raise StageError(f"StagePipeline was stopped after an error; start a new one ({self._error})")
            raise RuntimeError("StagePipeline is not started; use `with StagePipeline(...) as sp:` or sp.start()")
        pending: deque[int] = deque()
        done: dict[int, object] = {}  # finished out of order (replicated denoisers), waiting for earlier ones
        todo, end = iter(requests), object()
        request = next(todo, end)
        try:
            while request is not end or pending:
                if request is not end:
                    self.check_request(request)
                    try:
                        self._queues[0].put_nowait((self._next_index, request))
                        pending.append(self._next_index)
                        self._next_index += 1
                        request = next(todo, end)
                        continue
                    except queue.Full:
                        pass
                message = self._get(wait_once=request is not end)
                if message is not None:
                    index, result = message
                    done[index] = result["images"]
                    while pending and pending[0] in done:
                        yield done.pop(pending.popleft())
        finally:
            if pending and self._thread is not None and self._error is None and self._thread.is_alive():
                for _ in range(len(pending) - len(done)):  # a stream left early: drop its images, so the
                    self._get()  # next one starts clean

    # -- internals ----------------------------------------------------------------------------------------

    def check_request(self, request) -> None:
        """Raise TypeError / ValueError naming the problem if ``request`` would be refused."""
        if not isinstance(request, dict):
            raise TypeError(
                f"a request is a dict of {self.pipeline_class} call arguments, got {type(request).__name__}"
            )
        unknown = sorted(k for k in request if k not in self._call_arguments or k in SET_BY_STAGES)
        if unknown:
            raise ValueError(
                f"request arguments {unknown} are not allowed; {self.pipeline_class} takes "
                f"{', '.join(sorted(set(self._call_arguments) - set(SET_BY_STAGES)))}"
            )
        if "prompt" not in request:
            raise ValueError("a request needs a prompt (the text stage encodes it)")
        if request.get("output_type", "pil") not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {', '.join(OUTPUT_TYPES)}, got {request['output_type']!r}")

    def _put(self, message) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._queues[0].put(message, timeout=WAIT_S)
            except queue.Full:
                self._check(deadline, "accept a request")

    def _get(self, wait_once: bool = False):
        """The next finished message (None: end of stream); with ``wait_once``, None after one short wait."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._queues[-1].get(timeout=WAIT_S)
            except queue.Empty:
                self._check(deadline, "deliver the next image")
                if wait_once:
                    return None

    def _check(self, deadline: float, doing: str) -> None:
        """Raise StageError (after ending every worker) if a worker failed or nothing came before ``deadline``."""
        if self._error is not None or not self._thread.is_alive():
            error = self._error
            self._abort()
            if isinstance(error, ParallelError):
                raise self._stage_error(str(error)) from error
            if error is not None:
                raise StageError(f"StagePipeline workers failed: {error}") from error
            if doing != "close":
                raise StageError("StagePipeline workers ended before the stream did")
        elif time.monotonic() > deadline:
            self._error = self._stage_error(
                f"the workers did not {doing} within timeout_s={self.timeout_s:g} s (hung)"
            )
            self._abort()
            raise self._error

    def _stage_error(self, message: str) -> StageError:
        names = "; ".join(f"rank {r}: {'+'.join(stages)}" for r, stages in enumerate(self.layout))
        error = StageError(f"StagePipeline of {self.devices} processes ({names}) failed: {message}")
        error.pids = list(self.pids)
        return error

    def _abort(self) -> None:
        """End every worker now (idempotent) and release the queues."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._finished.set()
        if thread.is_alive():  # launch() has not reaped them yet, so the pids are still theirs
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        thread.join(30)  # launch() reaps the workers once they are gone
        for q in self._queues + [self._events]:
            q.cancel_join_thread()  # never block the caller's exit on a queue nobody reads
            q.close()


def _check_int(name: str, value, allowed: tuple[int, ...] = ()) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (allowed and value not in allowed):
        wanted = " or ".join(map(str, allowed)) if allowed else "a positive integer"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")


def _call_arguments(pipeline_class: str) -> tuple[str, ...]:
    import diffusers

    return tuple(inspect.signature(getattr(diffusers, pipeline_class).__call__).parameters)[1:]
