"""One torch thread for every test: on a 2-core machine shared with other work, more threads oversubscribe
the cores and tests run many times slower; single-threaded results are also reproducible.

Set at import (collection runs single-threaded too) and again for each test module by ``one_thread``,
which restores the previous count afterwards, so a test that changes it cannot leak into later modules.
Shared test helpers live in helpers.py (``from helpers import ...``).
"""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The files that take longest (minutes with `make test`'s two workers) run first, so that `--dist loadfile`
# does not leave one worker on a long file while the other has finished (`make test` passes
# --no-loadscope-reorder: xdist would otherwise order files by their number of tests).
LONGEST_FIRST = ("test_fuzz_server.py", "test_notebooks.py", "test_serving.py", "test_coexist.py",
                 "test_quantize_static.py")  # fmt: skip


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the other files is kept
