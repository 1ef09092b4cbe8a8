#!/usr/bin/env bash
# A one-step student of moving-digits (WanPipeline, 9-frame 32 px clips) at its default guidance 1.5 by the
# same command as the image students (fastdiff distill dmd), from the teacher's own weights (it predicts flow
# velocity, as the generator does): regression 0.5 on teacher flow-Euler-28 pairs, EMA 0.99, $DMD_STEPS
# updates (default 300, batch 16, 5 fake-score updates each), snapshots every 100 picked on seed 0 (100 clips)
# and reported on seed 1. Then one `fastdiff bench` run on report seed 1: 100 clips per call, 3 alternating
# rounds after a warm-up, one thread, digit / direction accuracy and FD against the like-for-like floor.
# Usage: benchmarks/onestep_video.sh [ROOT]   (default /tmp/fastdiff-onestep-video)
# Results: benchmarks/results/onestep_video.json; training time and peak memory in ROOT/time-dmd.txt and
# ROOT/dmd/fastdiff_distill.json. Re-running resumes unfinished training.
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-onestep-video}
FD=${FASTDIFF:-fastdiff}
OUT=$(dirname "$0")/results
STEPS=${DMD_STEPS:-300}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "$ROOT"
TEACHER="$ROOT/moving-digits"
[ -f "$TEACHER/model_index.json" ] || $FD zoo build moving-digits "$TEACHER" --size bench
# shellcheck source=benchmarks/onestep_runs.sh
. "$(dirname "$0")/onestep_runs.sh"
run dmd $FD distill dmd "$TEACHER" "$ROOT/dmd" --guidance 1.5 --train-steps "$STEPS" --batch 16 --fake-updates 5 \
  --lr 2e-5 --fake-lr 4e-5 --regression 0.5 --pair-steps 28 --ema-decay 0.99 --save-every 50 \
  --snapshot-every 100 --selection-seeds 0 --report-seeds 1 --pick-images 100
$FD bench "$TEACHER" --guidance 1.5 --threads 1 --runs 3 --seed 1 --batch 100 --steps 50 \
  --json "$OUT/onestep_video.json" --config "teacher unipc 50=" \
  --config "dmd 1=student(path=$ROOT/dmd/steps-1)"
