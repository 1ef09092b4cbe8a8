# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, copy the shipped digits reference model (hash-checked), run baseline vs accelerated
#   make test   - create .venv and run the test suite
# pip --no-compile: Python compiles the modules it imports instead of all of torch at install (~40 s less)
PY ?= python3
# Python writes its bytecode caches: with PYTHONDONTWRITEBYTECODE set (as on these machines) every process the
# suite starts would compile torch, diffusers and transformers again (~10 s more per process)
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test test-full test-ray lint clean test-xla fuzz-server soak wheel docs gpu-dry-run

$(BIN)/fastdiff: pyproject.toml references/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: pip takes the CPU build on this machine's disk instead of pulling a multi-GB CUDA build
	$(BIN)/pip install -q --no-compile torch==2.13.0
	# the reference models' files: a distribution of their own (the [zoo] extra), here from this checkout
	$(BIN)/pip install -q --no-compile -e references
	$(BIN)/pip install -q --no-compile -e ".[dev,bench,compress,serve]"
	touch $(BIN)/fastdiff

venv: $(BIN)/fastdiff

demo: venv
	$(BIN)/fastdiff demo

# Two pytest workers, a test file each at a time (module fixtures built once): the tests run one torch thread each,
# so on 2 cores the suite takes about half as long as in one process. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

# `make test` (CI) leaves out the tests marked `full`: the compatibility matrix's variant rows, the sweep
# notebooks, the GPU dry run and inductor compiles; `make test-full` runs them too (about twice as long).
PYTEST := HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: venv
	$(PYTEST) -m "not ray and not full"

test-full: venv
	$(PYTEST) -m "not ray"

# Ray Serve with two replicas, one killed under load (Ray's own start-up is most of its 1.5-2.5 minutes)
test-ray: venv
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m ray tests/serving/test_serving.py

# benchmarks/gpu.py's whole dry run on the CPU (tiny models, fp16 and bf16; the suite runs bf16 only): run it
# before spending a lent GPU's minutes on `sh benchmarks/gpu.sh`
gpu-dry-run: venv
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/gpu.py --dry-run --out /tmp/gpu_dry_run.json

# The longer schemathesis profile of the server (the suite runs 40 examples per operation): results/fuzz_server.json
fuzz-server: venv
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/fuzz_server.py --max-examples 1000

# The server under mixed valid/invalid load for 10 minutes: results/soak.json
soak: venv
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/soak.py --minutes 10

# torch-xla 2.9.0 works only with torch 2.9.0, so the XLA tests get their own venv (about 4 GB downloaded, 7 GB on
# disk; made once). fastdiff goes in without its dependencies (they pin torch 2.13), with what the tests import.
XLA_VENV ?= .venv-xla
XLA_BIN := $(XLA_VENV)/bin

$(XLA_VENV)/.installed:
	$(PY) -m venv $(XLA_VENV)
	$(XLA_BIN)/pip install -q --upgrade pip
	$(XLA_BIN)/pip install -q --no-compile torch==2.9.0 torch-xla==2.9.0 diffusers==0.42.1 "transformers>=5,<6" \
		accelerate safetensors scikit-learn scipy pillow psutil tqdm pyyaml pytest pytest-timeout
	$(XLA_BIN)/pip install -q --no-compile --no-deps -e . torch-pruning==1.6.1 torchmetrics lightning-utilities \
		torchsde trampoline
	$(XLA_BIN)/python -c "import torch; assert torch.__version__.startswith('2.9.0'), torch.__version__"
	touch $@

# the tpu-infer driver test runs in a process of its own: after the ~30 others, torch_xla.sync() crashed in it
# (docs/xla.md, known problem)
test-xla: $(XLA_VENV)/.installed
	HF_HUB_OFFLINE=1 PJRT_DEVICE=CPU $(XLA_BIN)/python -m pytest -m xla tests/xla/test_xla.py -k "not tpu_infer_driver"
	HF_HUB_OFFLINE=1 PJRT_DEVICE=CPU $(XLA_BIN)/python -m pytest -m xla tests/xla/test_xla.py -k "tpu_infer_driver"

# The wheel and sdist in dist/, checked: metadata and README rendering (twine), the wheel's file list
# (check-wheel-contents: no duplicate files, no stray top-level modules, every package in it)
wheel: venv
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/python -m build --outdir dist references
	$(BIN)/twine check dist/*
	$(BIN)/check-wheel-contents dist/*.whl

# The documentation site in site/ (mkdocs.yml); --strict fails on broken links and API references
docs: venv
	$(BIN)/mkdocs build --strict

lint: venv
	$(BIN)/ruff check fastdiff tests benchmarks
	$(BIN)/ruff format --check fastdiff tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .fastdiff-cache out dist site
