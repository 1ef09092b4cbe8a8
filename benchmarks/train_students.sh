#!/usr/bin/env bash
# Train every digits student that benchmarks/distill_bench.sh measures (README: Distillation).
# Usage: benchmarks/train_students.sh [OUT_ROOT]   (default /tmp/fastdiff-students; re-running resumes)
# Run with OMP_NUM_THREADS=1: on 2 CPU cores with nothing else running the set takes 29.5 minutes (docs/distillation.md
# has each run); each run's wall time and peak memory are printed by /usr/bin/time and recorded in the student's
# fastdiff_distill.json.
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-students}
FD=${FASTDIFF:-fastdiff}
mkdir -p "$ROOT"
TEACHER="$ROOT/digits"
[ -f "$TEACHER/model_index.json" ] || $FD zoo build digits "$TEACHER" --size bench
run() {  # run NAME CMD...: skip a finished run, resume an interrupted one
  local name=$1; shift
  if [ -f "$ROOT/$name/fastdiff_distill.json" ] && grep -q '"done": true' "$ROOT/$name/fastdiff_distill.json"; then
    echo "== $name: done"; return; fi
  local resume=""; [ -d "$ROOT/$name" ] && resume="--resume"
  echo "== $name $(date +%T)"
  /usr/bin/time -f "== $name: %e s wall, peak RSS %M KiB" "$@" $resume 2>&1 | tr '\r' '\n' | grep -E "^== |Error|error" || true
}
G2="--guidance-range 2"
run cons-g2 $FD distill consistency "$TEACHER" "$ROOT/cons-g2" $G2 --train-steps 1000 --batch 64 --save-every 200
run progressive-g2 $FD distill progressive "$TEACHER" "$ROOT/progressive-g2" --from 16 --to 1 --guidance 2 --steps-per-round 400 --batch 32 --save-every 200
run lcm-lora-g2 $FD distill consistency "$TEACHER" "$ROOT/lcm-lora-g2" $G2 --lora 4 --train-steps 600 --batch 32 --lr 1e-3 --save-every 200
run consistency-g1 $FD distill consistency "$TEACHER" "$ROOT/consistency-g1" --guidance-range 1 --train-steps 600 --batch 32 --save-every 200
run progressive-g1 $FD distill progressive "$TEACHER" "$ROOT/progressive-g1" --from 16 --to 1 --guidance 1 --steps-per-round 300 --batch 32 --save-every 150
