#!/usr/bin/env bash
# Teacher vs distilled students of the digits reference, at guidance 2 and 1: one `fastdiff bench` run each.
# Usage: benchmarks/distill_bench.sh [STUDENTS_ROOT]  (what benchmarks/train_students.sh wrote)
# Three alternating timed rounds of 500 images per config after an untimed warm-up call, one torch thread
# (min and max kept for every ratio): 22 minutes for both scales on 2 CPU cores with nothing else running.
# Then:  python benchmarks/distill_table.py --students ROOT   (markdown tables for the README from the JSON)
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-students}
FD=${FASTDIFF:-fastdiff}
OUT=$(dirname "$0")/results
bench() {  # bench GUIDANCE TAG
  local g=$1 tag=$2 cfgs=()
  cfgs+=(--config "teacher DDIM 50=scheduler(name=ddim,steps=50)" --config "teacher dpm++2m 10=scheduler(name=dpm++2m,steps=10)")
  for k in 8 4 2 1; do cfgs+=(--config "progressive $k=student(path=$ROOT/progressive-$tag/steps-$k)"); done
  for k in 8 4 2 1; do cfgs+=(--config "consistency $k=student(path=$ROOT/$3,steps=$k,unvalidated=true)"); done  # every count, validated or not
  [ "$tag" = g2 ] && cfgs+=(--config "LCM-LoRA 4=lcm-lora(path=$ROOT/lcm-lora-g2,steps=4)")
  $FD bench "$ROOT/digits" --guidance "$g" --threads 1 --runs 3 --seed 0 --json "$OUT/distill_$tag.json" "${cfgs[@]}"
}
bench 2 g2 cons-g2
bench 1 g1 consistency-g1
