#!/usr/bin/env bash
# One-step students of the digits reference by distribution matching (fastdiff distill dmd), beside the
# teacher and the progressive 1-step student they start from, in one `fastdiff bench` run per guidance.
# Usage: benchmarks/onestep_digits.sh [ROOT] [GUIDANCE ...]   (default /tmp/fastdiff-onestep, guidance 2 then 1)
# Each guidance: progressive 16 -> 1 (as benchmarks/train_students.sh), then DMD from its 1-step student for
# $DMD_STEPS generator updates (default 1200, batch 64, 5 fake-score updates each), snapshots every 100 picked
# on seed 0 (500 images); then the bench on seed 1 (report seed: disjoint from the pick), 500 images, 3
# alternating rounds, one thread. Training wall time and peak memory: /usr/bin/time lines in ROOT/time-*.txt
# and the students' fastdiff_distill.json. Re-running resumes unfinished training.
# VARIANT=NAME VARIANT_ARGS="..." adds a DMD run dmd-NAME-<tag> with those extra options from the same start
# (e.g. VARIANT=gan VARIANT_ARGS="--gan 3e-3 --gan-d 1e-2"), benched beside the others into onestep_<tag>_NAME.json;
# VARIANT_INIT=DIR starts it from another one-step student (default: the progressive one), e.g. to train on.
# RECIPE=NAME RECIPE_ARGS="..." gives the main DMD run those extra options instead (dmd-NAME-<tag>, results in
# onestep_<tag>_NAME.json), so one recipe is trained and timed alone from scratch (progressive start included).
# CONSISTENCY=1 also trains the consistency student of benchmarks/train_students.sh (consistency-<tag>) and
# benches it at 1, 2 and 4 steps beside the others, so the three methods are measured in one run.
set -euo pipefail
ROOT=${1:-/tmp/fastdiff-onestep}
shift || true
GUIDANCES=${*:-2 1}
FD=${FASTDIFF:-fastdiff}
OUT=$(dirname "$0")/results
STEPS=${DMD_STEPS:-1200}
mkdir -p "$ROOT"
TEACHER="$ROOT/digits"
[ -f "$TEACHER/model_index.json" ] || $FD zoo build digits "$TEACHER" --size bench
# shellcheck source=benchmarks/onestep_runs.sh
. "$(dirname "$0")/onestep_runs.sh"
for g in $GUIDANCES; do
  tag="g${g%.*}"
  run "progressive-$tag" $FD distill progressive "$TEACHER" "$ROOT/progressive-$tag" --from 16 --to 1 \
    --guidance "$g" --steps-per-round 400 --batch 32 --save-every 200
  main="dmd${RECIPE:+-$RECIPE}-$tag"
  # shellcheck disable=SC2086  # RECIPE_ARGS is a list of options (later options override the defaults)
  run "$main" $FD distill dmd "$TEACHER" "$ROOT/$main" --init "$ROOT/progressive-$tag/steps-1" \
    --guidance "$g" --train-steps "$STEPS" --batch 64 --fake-updates 5 --lr 1e-5 --fake-lr 2e-5 \
    ${RECIPE_ARGS:-} --save-every 50 --snapshot-every 100 --selection-seeds 0 --report-seeds 1
  extra=() json="$OUT/onestep_$tag${RECIPE:+_$RECIPE}.json"
  if [ -n "${CONSISTENCY:-}" ]; then  # train_students.sh's settings for this guidance
    if [ "$tag" = g1 ]; then size="--train-steps 600 --batch 32"; else size="--train-steps 1000 --batch 64"; fi
    # shellcheck disable=SC2086  # size is a list of options
    run "consistency-$tag" $FD distill consistency "$TEACHER" "$ROOT/consistency-$tag" --guidance-range "$g" \
      $size --save-every 200
    for k in 1 2 4; do
      extra+=(--config "consistency $k=student(path=$ROOT/consistency-$tag,steps=$k,unvalidated=true)")
    done
  fi
  if [ -n "${VARIANT:-}" ]; then
    # shellcheck disable=SC2086  # VARIANT_ARGS is a list of options
    run "dmd-$VARIANT-$tag" $FD distill dmd "$TEACHER" "$ROOT/dmd-$VARIANT-$tag" \
      --init "${VARIANT_INIT:-$ROOT/progressive-$tag/steps-1}" \
      --guidance "$g" --train-steps "$STEPS" --batch 64 --fake-updates 5 --lr 1e-5 --fake-lr 2e-5 \
      ${VARIANT_ARGS:-} --save-every 50 --snapshot-every 100 --selection-seeds 0 --report-seeds 1
    extra+=(--config "dmd $VARIANT 1=student(path=$ROOT/dmd-$VARIANT-$tag/steps-1)") json="$OUT/onestep_${tag}_$VARIANT.json"
    # a variant trained on from another variant is benched beside it
    case "${VARIANT_INIT:-}" in */dmd-*-"$tag"/steps-1)
      base=$(basename "$(dirname "$VARIANT_INIT")"); base=${base#dmd-}; base=${base%-"$tag"}
      extra+=(--config "dmd $base 1=student(path=$VARIANT_INIT)") ;;
    esac
  fi
  $FD bench "$TEACHER" --guidance "$g" --threads 1 --runs 3 --seed 1 --json "$json" \
    --config "teacher DDIM 50=scheduler(name=ddim,steps=50)" \
    --config "teacher dpm++2m 10=scheduler(name=dpm++2m,steps=10)" \
    --config "progressive 1=student(path=$ROOT/progressive-$tag/steps-1)" \
    --config "dmd${RECIPE:+ $RECIPE} 1=student(path=$ROOT/$main/steps-1)" "${extra[@]}"
done
