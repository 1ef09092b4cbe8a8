#!/bin/sh
# Builds benchmarks/compress_digits.py's compressed models (recovery fine-tuning) on a GPU machine that has
# torch but not diffusers/torch-pruning, then packs them for the CPU benchmark. Recovery is the slow part on
# CPU (10k steps of the pruned student: hours on 2 cores); sampling and timing stay on the CPU machine.
#   here:   pip download diffusers==0.42.1 torch-pruning==1.6.1 importlib_metadata -d .whl (see the README)
#           cp -r .fastdiff-cache/digits/{model_index.json,unet,scheduler,eval} .device-carry/digits/
#   there:  sh benchmarks/recover_on_gpu.sh OUT_DIR
#   here:   tar xzf OUT_DIR/compressed.tgz -C /tmp/fastdiff-compress-digits
#           .venv/bin/python benchmarks/compress_digits.py --model .fastdiff-cache/digits
set -e
out=${1:?usage: recover_on_gpu.sh OUT_DIR [compress_digits.py options]}
shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
status=0
timeout "${BUILD_TIMEOUT:-3000}" python3 benchmarks/compress_digits.py --model .device-carry/digits --work /tmp/work --build-only "$@" \
    > "$out/build.log" 2>&1 || status=$?
grep -h '"device"\|"seconds"\|loss_last' /tmp/work/*/fastdiff_compress.json || true
tar czf "$out/compressed.tgz" -C /tmp/work .
tail -20 "$out/build.log"
exit $status
