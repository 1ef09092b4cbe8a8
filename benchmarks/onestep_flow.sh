#!/usr/bin/env bash
# A one-step student of digits-flow (SD3 pipeline) at its default guidance 1.5 by distribution matching
# (fastdiff distill dmd), beside the teacher and the progressive 1-step student it starts from.
# Usage: benchmarks/onestep_flow.sh [ROOT]   (default /tmp/fastdiff-onestep-flow)
# 1. progressive flow Euler 16 -> 1 (guidance baked in; as benchmarks/flow_student.sh, on to one step);
# 2. DMD from its 1-step student ($DMD_STEPS updates, default 600, batch 16, 5 fake-score updates each, the
#    digits guidance-1 recipe: regression 0.5 on teacher flow-Euler-28 pairs, EMA 0.99), snapshots every 100
#    picked on seed 0 (500 images) and reported on seed 1;
# 3. quality: one `fastdiff bench` run on report seed 1, 500 images in one call per config (the teacher's 28
#    guided steps cost about 15 minutes at this size), one round, no warm-up -> onestep_flow_quality.json;
# 4. speed: one `fastdiff bench` run at 64 images per call, 3 alternating rounds after a warm-up, one thread,
#    no quality -> onestep_flow_speed.json. Both runs hold every config.
# Training wall time and peak memory: /usr/bin/time lines in ROOT/time-*.txt and each fastdiff_distill.json.
# Re-running resumes unfinished training and skips finished steps.
# RECIPE=NAME RECIPE_ARGS="..." gives the DMD run those extra options (dmd-NAME; later options override the
# defaults), benched as "dmd NAME 1" into onestep_flow_quality_NAME.json and onestep_flow_speed_NAME.json.
# PROGRESSIVE_ARGS="..." does the same for the progressive start (use a fresh ROOT: ROOT/progressive is reused);
# DMD_STEPS=0 trains and benches the progressive start alone (name the results with RECIPE).
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-onestep-flow}
FD=${FASTDIFF:-fastdiff}
OUT=$(dirname "$0")/results
STEPS=${DMD_STEPS:-600}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
if [ "$STEPS" -eq 0 ] && [ -z "${RECIPE:-}" ]; then
  echo "DMD_STEPS=0 needs RECIPE=NAME, so its results do not replace the shipped student's" >&2
  exit 2
fi
mkdir -p "$ROOT"
TEACHER="$ROOT/digits-flow"
[ -f "$TEACHER/model_index.json" ] || $FD zoo build digits-flow "$TEACHER" --size bench
# shellcheck source=benchmarks/onestep_runs.sh
. "$(dirname "$0")/onestep_runs.sh"
# shellcheck disable=SC2086  # PROGRESSIVE_ARGS is a list of options
run progressive $FD distill progressive "$TEACHER" "$ROOT/progressive" --from 16 --to 1 --guidance 1.5 \
  --steps-per-round 150 --batch 8 --pool 128 --save-every 100 ${PROGRESSIVE_ARGS:-}
main="dmd${RECIPE:+-$RECIPE}" suffix="${RECIPE:+_$RECIPE}"
configs=(
  --config "teacher flow-euler 28=scheduler(name=flow-euler,steps=28)"
  --config "teacher flow-euler 4=scheduler(name=flow-euler,steps=4)"
  --config "progressive 1=student(path=$ROOT/progressive/steps-1)"
)
if [ "$STEPS" -gt 0 ]; then
  # shellcheck disable=SC2086  # RECIPE_ARGS is a list of options
  run "$main" $FD distill dmd "$TEACHER" "$ROOT/$main" --init "$ROOT/progressive/steps-1" --guidance 1.5 \
    --train-steps "$STEPS" --batch 16 --fake-updates 5 --lr 2e-5 --fake-lr 4e-5 --regression 0.5 \
    --pair-steps 28 --ema-decay 0.99 ${RECIPE_ARGS:-} --save-every 50 --snapshot-every 100 --selection-seeds 0 \
    --report-seeds 1
  configs+=(--config "dmd${RECIPE:+ $RECIPE} 1=student(path=$ROOT/$main/steps-1)")
fi
[ -f "$ROOT/quality$suffix.done" ] || {
  $FD bench "$TEACHER" --guidance 1.5 --threads 1 --runs 1 --no-warmup --seed 1 --batch 500 \
    --json "$OUT/onestep_flow_quality$suffix.json" "${configs[@]}"
  touch "$ROOT/quality$suffix.done"
}
$FD bench "$TEACHER" --guidance 1.5 --threads 1 --runs 3 --seed 1 --batch 64 --no-quality \
  --json "$OUT/onestep_flow_speed$suffix.json" "${configs[@]}"
