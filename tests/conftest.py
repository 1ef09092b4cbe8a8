"""One torch thread for every test: on a 2-core machine shared with other work, more threads oversubscribe
the cores and tests run many times slower; single-threaded results are also reproducible."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
