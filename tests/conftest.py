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
