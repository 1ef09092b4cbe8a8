#!/usr/bin/env bash
# tiny-vae on the references: a tiny decoder distilled from digits-sd's VAE (digits-flow's VAE has the same
# weights), its quality cost and whole-call speed in one `fastdiff bench` run on digits-sd (report seed 1, 500
# images, 3 alternating rounds, one thread), then where the time of a one-step call goes with and without it
# (digits-flow, and SD 1.5 size with TAESD's layout at random weights: benchmarks/onestep_split.py).
# Usage: benchmarks/tiny_vae.sh [ROOT]   (default /tmp/fastdiff-tiny-vae; TINY_STEPS training steps, default 2000)
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-tiny-vae}
FD=${FASTDIFF:-fastdiff}
PY=${PYTHON:-python}
OUT=$(dirname "$0")/results
mkdir -p "$ROOT"
[ -f "$ROOT/digits-sd/model_index.json" ] || $FD zoo build digits-sd "$ROOT/digits-sd" --size bench
if [ ! -f "$ROOT/taesd/config.json" ]; then
  /usr/bin/time -o "$ROOT/time-taesd.txt" -f "tiny-vae: %e s wall, peak RSS %M KiB" \
    $FD distill tiny-vae "$ROOT/digits-sd" "$ROOT/taesd" --steps "${TINY_STEPS:-2000}"
  cat "$ROOT/time-taesd.txt"
fi
tiny="tiny-vae(path=$ROOT/taesd)"
$FD bench "$ROOT/digits-sd" --batch 500 --threads 1 --runs 3 --seed 1 --json "$OUT/tiny_vae_digits_sd.json" \
  --config "dpm++2m 20=scheduler(name=dpm++2m,steps=20)" \
  --config "dpm++2m 20 + tiny-vae=scheduler(name=dpm++2m,steps=20);$tiny" \
  --config "dpm++2m 4=scheduler(name=dpm++2m,steps=4)" \
  --config "dpm++2m 4 + tiny-vae=scheduler(name=dpm++2m,steps=4);$tiny"
$PY -m benchmarks.onestep_split --runs 3 --tiny-vae "$ROOT/taesd" --json "$OUT/tiny_vae_split.json"
