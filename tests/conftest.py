"""One torch thread for every test: on a 2-core machine shared with other work, more threads oversubscribe
the cores and tests run many times slower; single-threaded results are also reproducible.

Set at import (collection runs single-threaded too) and again for each test module by ``one_thread``,
which restores the previous count afterwards, so a test that changes it cannot leak into later modules.
Shared test helpers live in helpers.py (``from helpers import ...``); the ``pipes`` fixture gives a module's tiny
pipelines. The tests sit in folders that mirror the package (tests/cache for fastdiff/cache, ...); tests/project
holds the repository-wide ones (docs, notebooks, wheel, import layers, GPU script).
"""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


class TinyPipes:
    """The test-size zoo pipelines by name, each built on first use: ``pipes["tiny-sd"]`` or ``pipes("tiny-sd")``."""

    def __init__(self):
        self.built = {}

    def __getitem__(self, name: str):
        if name not in self.built:
            from helpers import tiny_pipe

            self.built[name] = tiny_pipe(name)
        return self.built[name]

    __call__ = __getitem__


@pytest.fixture(scope="module")
def pipes():
    """One module's tiny pipelines (a module with other pipelines defines its own ``pipes``)."""
    return TinyPipes()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The files that take longest (minutes with `make test`'s two workers) run first, so that `--dist loadfile`
# does not leave one worker on a long file while the other has finished (`make test` passes
# --no-loadscope-reorder: xdist would otherwise order files by their number of tests).
LONGEST_FIRST = (
    "test_fuzz_server.py",
    "test_coexist.py",
    "test_notebooks.py",
    "test_coexist_flow_dit.py",
    "test_video.py",
    "test_quantize_static.py",
)
# Files whose tests start several processes at once (workers, a server and its fuzzing client): one work unit, so
# they run one after another on one worker; beside each other, 5 processes on 2 cores took 30-60% longer.
SEVERAL_PROCESSES = (
    "test_fuzz_server.py",
    "test_parallel_async.py",
    "test_parallel.py",
    "test_stages.py",
    "test_serving.py",
    "test_parallel_async_variants.py",
    "test_parallel_sequence.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        if name in SEVERAL_PROCESSES:
            return 0  # the group starts first: it is the longest unit
        return 1 + LONGEST_FIRST.index(name) if name in LONGEST_FIRST else 1 + len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the other files is kept


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the SEVERAL_PROCESSES files as one unit (see there)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndProcessGroup(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "several-processes" if file.rsplit("/", 1)[-1] in SEVERAL_PROCESSES else file

    return FilesAndProcessGroup(config, log)
