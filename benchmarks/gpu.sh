#!/bin/sh
# The GPU benchmark as one command (docs/gpu.md): installs the carried wheels, then runs benchmarks/gpu.py.
# The lent machine has torch (CUDA), transformers, accelerate, peft and torchmetrics but no diffusers, so these
# wheels travel in .whl/ (pure Python; download them here with --no-deps so nothing shadows the machine's torch):
#   .venv/bin/pip download --no-deps -d .whl diffusers==0.42.1 tomesd==0.1.3 DeepCache==0.1.1 importlib_metadata zipp
#   optional: a torchao wheel built for the machine's torch (fp8 + compile rows; skipped with the reason without it)
# Run (arguments go to gpu.py; $OUT, when set, receives a copy of the JSON and the log):
#   sh benchmarks/gpu.sh --time-limit 420
set -e
missing=""
for wheel in diffusers tomesd importlib_metadata; do
    ls .whl 2>/dev/null | grep -qi "^${wheel}-.*\.whl$" || missing="$missing $wheel"
done
if [ -n "$missing" ]; then
    echo "gpu.sh: no wheel in .whl/ for:$missing (see the top of this file)" >&2
    exit 2
fi
ls .whl | grep -qi "^deepcache-" || echo "gpu.sh: no DeepCache wheel (only benchmarks/deepcache_vs_package.py needs it)"
ls .whl | grep -qi "^torchao-" || echo "gpu.sh: no torchao wheel: the fp8 + compile rows will be skipped"
site=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "gpu.sh: no nvidia-smi"
log=/tmp/gpu_bench.log
{ python3 benchmarks/gpu.py "$@" 2>&1; echo $? >/tmp/gpu_bench.rc; } | tee "$log"
status=$(cat /tmp/gpu_bench.rc)
if [ -n "$OUT" ]; then
    cp benchmarks/results/gpu_*.json "$OUT"/ 2>/dev/null || true
    cp "$log" "$OUT"/
fi
exit $status
