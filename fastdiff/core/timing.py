"""Wall and CPU time of repeated calls, with the process's peak resident memory.

``fastdiff bench`` and the parallel workers (``fastdiff.parallel.run``) time their runs with the same code.

Example::

    from fastdiff.core.timing import time_runs
    seconds, output, peak_mib, cpu_seconds = time_runs(lambda: fp(**call), runs=3)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import psutil


@contextmanager
def peak_rss_mb(interval: float = 0.005):
    """Sample this process's resident memory in a thread; yields a dict whose "peak" is set on exit (MiB)."""
    process, result, stop = psutil.Process(), {"peak": 0.0}, threading.Event()

    def sample():
        while not stop.is_set():
            result["peak"] = max(result["peak"], process.memory_info().rss / 2**20)
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        result["peak"] = max(result["peak"], process.memory_info().rss / 2**20)


def time_runs(fn: Callable[[], Any], runs: int, on_run: Callable[[], None] | None = None, warmup: bool = True):
    """One untimed warm-up, then ``runs`` timed calls.

    Returns (wall seconds per run, last output, peak RSS MiB, process CPU seconds per run). CPU time is the
    steadier figure on a machine shared with other work.
    """
    if warmup:
        fn()
    seconds, cpu_seconds, output = [], [], None
    with peak_rss_mb() as rss:
        for _ in range(runs):
            start, cpu = time.perf_counter(), time.process_time()
            output = fn()
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu)
            if on_run:
                on_run()
    return seconds, output, rss["peak"], cpu_seconds
