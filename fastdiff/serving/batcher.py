"""Dynamic batching on asyncio: jobs with the same key are run together, up to ``max_batch`` images or after
``max_wait_s``, on one worker thread (the pipeline is never called concurrently). The wait starts when the
oldest job arrived or when the worker became free, whichever is later: jobs that queued behind a running batch
still get a window to fill up, which keeps batches full when clients alternate profiles (their answers and
next requests arrive just after the batch ends).

The queue is bounded (``QueueFull`` past ``max_queue`` waiting jobs, which the app turns into 429); a job whose
caller gave up (``job.drop()``, on timeout) is taken out of the queue, and a running batch whose jobs all gave
up is told to stop (``job.dropped`` is read by the batch function between denoising steps).

Example::

    import asyncio
    from fastdiff.serving.batcher import Batcher

    async def main():
        b = Batcher(lambda jobs: [sum(j.payload) for j in jobs], max_batch=8, max_wait_s=0.01, max_queue=16)
        worker = asyncio.create_task(b.run())
        jobs = [b.submit(key="k", payload=[i, 1], images=1) for i in range(3)]
        print(await asyncio.gather(*(j.future for j in jobs)))  # [1, 2, 3], one batch of 3
        await b.stop(); await worker

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` waiting jobs."""


class WorkerStopped(RuntimeError):
    """The batch worker is no longer running: nothing queued will be served by this process."""


@dataclass(eq=False)
class Job:
    key: Hashable
    payload: Any
    images: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None
    dropped: bool = False

    def drop(self) -> None:
        """The caller gave up: leave the queue, and stop the batch if every job in it gave up."""
        self.dropped = True


class Batcher:
    """Collects jobs into batches for ``run_batch(jobs) -> results`` (one result per job, same order)."""

    def __init__(
        self,
        run_batch: Callable[[list[Job]], list[Any]],
        max_batch: int = 8,
        max_wait_s: float = 0.02,
        max_queue: int = 64,
        on_batch: Callable[[list[Job]], None] | None = None,
    ):
        for name, value in (("max_batch", max_batch), ("max_queue", max_queue)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s!r}")
        self.run_batch, self.on_batch = run_batch, on_batch
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.pending: deque[Job] = deque()
        self.batch_seconds = 0.0  # the last batch's run time (for Retry-After)
        self._free_since = 0.0  # when the worker finished its last batch
        self._wakeup = asyncio.Event()
        self._stopping = False
        self.failure: WorkerStopped | None = None  # set if the worker loop ended with an error
        self._running: list[Job] = []  # the batch taken from the queue, until its results are handed out
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdiff-batch")

    @property
    def depth(self) -> int:
        return sum(not job.dropped for job in self.pending)

    def submit(self, key: Hashable, payload: Any, images: int = 1) -> Job:
        """Queue a job; its ``future`` gets the result. Raises ``QueueFull`` instead of growing the queue."""
        if self.failure is not None:
            raise self.failure
        if self._stopping:
            raise QueueFull("the server is shutting down")
        self._prune()
        if len(self.pending) >= self.max_queue:
            raise QueueFull(f"{len(self.pending)} requests are waiting (--max-queue {self.max_queue})")
        job = Job(key, payload, images, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        self._wakeup.set()
        return job

    def retry_after_s(self) -> int:
        """A guess at when the queue has room: the batches ahead times the last batch's duration."""
        batches = max(1, -(-sum(j.images for j in self.pending) // self.max_batch))
        return max(1, round(batches * self.batch_seconds))

    async def run(self) -> None:
        """The worker loop; returns after ``stop()`` once the queue is empty. If it fails, every waiting job
        and every later ``submit`` get ``WorkerStopped``."""
        try:
            await self._loop()
        except BaseException as error:
            self.failure = WorkerStopped(f"the batch worker stopped ({type(error).__name__}: {error})")
            for job in [*self._running, *self.pending]:
                if not job.future.done():
                    job.future.set_exception(self.failure)
            self.pending.clear()
            raise

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._prune()
            if not self.pending:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self.pending[0]
            opens = max(first.arrived, self._free_since)
            while not self._stopping and self._fill(first.key) < self.max_batch and not first.dropped:
                remaining = opens + self.max_wait_s - time.perf_counter()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch = self._running = self._take(first.key)
            if not batch:
                continue
            started = time.perf_counter()
            for job in batch:
                job.started = started
            if self.on_batch:
                self.on_batch(batch)
            try:
                results = await loop.run_in_executor(self._executor, self.run_batch, batch)
            except Exception as error:  # noqa: BLE001 (handed to every waiting caller)
                for job in batch:
                    if not job.future.done() and not job.dropped:
                        job.future.set_exception(error)
            else:
                for job, result in zip(batch, results, strict=True):
                    if not job.future.done() and not job.dropped:
                        job.future.set_result(result)
            self.batch_seconds = time.perf_counter() - started
            self._free_since = time.perf_counter()

    async def stop(self) -> None:
        """Refuse new jobs; ``run`` finishes the queued ones, then returns."""
        self._stopping = True
        self._wakeup.set()

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _prune(self) -> None:
        self.pending = deque(job for job in self.pending if not job.dropped)

    def _fill(self, key: Hashable) -> int:
        return sum(job.images for job in self.pending if job.key == key and not job.dropped)

    def _take(self, key: Hashable) -> list[Job]:
        batch, rest, images = [], deque(), 0
        for job in self.pending:
            if job.dropped:
                continue
            # The first job always goes (even when it alone has more images than max_batch).
            if job.key == key and (not batch or images + job.images <= self.max_batch):
                batch.append(job)
                images += job.images
            else:
                rest.append(job)
        self.pending = rest
        return batch
