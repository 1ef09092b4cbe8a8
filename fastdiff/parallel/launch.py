"""Start N worker processes with a ``torch.distributed`` process group and collect rank 0's result.

``torchrun --nproc-per-node N script.py`` does the same for a user's script; ``launch`` is for callers that
start the workers themselves (``fastdiff generate --devices N``, the tests). Built on
``torch.multiprocessing.start_processes``. Workers are forked from a fork server that has imported fastdiff
once (``start_context``; a fresh interpreter imports torch, diffusers and peft in about 20 s on a 2-core machine,
paid then once per caller process instead of once per worker); where there is no fork server they are spawned.
When one worker fails, the others are terminated and the error
(with the worker's traceback) is raised in the caller; a worker that hangs makes the others' collectives time
out after ``timeout_s``, which ends the run the same way.

Example::

    from fastdiff.parallel.launch import launch

    def work(rank, world):
        import torch.distributed as dist
        return dist.get_world_size()

    assert launch(work, devices=2) == 2
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException


class ParallelError(RuntimeError):
    """A worker process failed, died or timed out; the message names the rank and the cause.

    ``pids``: the worker processes' ids (all ended when the error is raised).
    """

    pids: list[int] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world: int, port: int, timeout_s: float = 60.0, backend: str | None = None) -> None:
    """Join the process group of ``world`` ranks on 127.0.0.1:``port`` (gloo on CPU, nccl with CUDA)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS; False where the
    C library is not glibc (nothing changed).

    By default every tensor over 32 MB is a fresh ``mmap`` and each of its pages faults when first written:
    measured here, a digits call at batch 500 split over two processes took 1.5 and 4.1 million page faults
    per call (6 and 16 GB of pages zeroed). With this the process's heap keeps its peak size instead (it does
    not shrink after a call). ``launch`` calls it in every worker; in a ``torchrun`` script call it first, or
    set ``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647``.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def pin_to_cores(rank: int, world: int, threads: int) -> set[int] | None:
    """Bind this process to its own ``threads`` CPU cores: rank r takes the r-th group of the cores the process
    may run on. Returns them, or None (nothing changed) where ``world x threads`` cores are not available.

    Without it the kernel moves the ranks between cores whenever one blocks in a collective and wakes up, and
    each move costs the rank its L1/L2 caches: measured here, tiny-sd async calls took 12.4-13.2 s pinned
    against 13.6-14.6 s unpinned (2 ranks x 1 thread on 2 cores, interleaved with one-process calls).
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if world * threads > len(cores):
        return None
    mine = set(cores[rank * threads : (rank + 1) * threads])
    os.sched_setaffinity(0, mine)
    return mine


PRELOAD = ["fastdiff", "fastdiff.zoo", "diffusers.pipelines"]  # imported once, in the fork server


def start_context():
    """The multiprocessing context ``launch`` starts workers with: "forkserver" preloading ``PRELOAD`` where the
    platform has it (the server imports only these, never initializes CUDA, and forks each worker), else
    "spawn". Workers see the environment the server was started with (the first call), and the caller's sys.path
    and working directory as of each call."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    return context


def _worker(rank, fn, world, port, timeout_s, threads, result_dir, args, retain_memory=True, pin=None):
    torch.set_num_threads(threads)
    if retain_memory:
        retain_freed_memory()
    if pin or (pin is None and not torch.cuda.is_available()):
        pin_to_cores(rank, world, threads)
    init_group(rank, world, port, timeout_s)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, Path(result_dir) / "result.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(
    fn,
    devices: int,
    *args,
    timeout_s: float = 60.0,
    threads: int = 1,
    retain_memory: bool = True,
    pin_cores: bool | None = None,
):
    """Run ``fn(rank, devices, *args)`` in ``devices`` processes of one process group; rank 0's return value.

    ``fn`` must be importable (a module-level function): workers start from a fork server (``start_context``).
    Each worker uses ``threads`` torch threads and, unless ``retain_memory=False``, ``retain_freed_memory()``.
    Each is bound to its own cores (``pin_to_cores``) when there are enough: by default only without CUDA (the ranks compute on
    the CPU); ``pin_cores=False`` never, ``True`` also with CUDA. Raises ParallelError naming the failed rank.
    """
    if not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive integer, got {devices!r}")
    with tempfile.TemporaryDirectory(prefix="fastdiff-parallel-") as tmp:
        spawn_args = (fn, devices, free_port(), timeout_s, threads, tmp, args, retain_memory, pin_cores)
        method = start_context().get_start_method()
        context = mp.start_processes(_worker, args=spawn_args, nprocs=devices, join=False, start_method=method)
        try:
            while not context.join():
                pass
        except ProcessException as error:  # join() has terminated the other workers
            failed = ParallelError(
                f"parallel run of {devices} processes failed: rank {error.error_index}: "
                f"{str(error).strip().splitlines()[-1]}"
            )
            failed.pids = context.pids()
            raise failed from error
        finally:
            for process in context.processes:  # never leave a worker behind
                if process.is_alive():
                    process.kill()
                    process.join(5)
        return torch.load(Path(tmp) / "result.pt", weights_only=False)
