#!/bin/sh
# Few-step use of a flow model: a 4-step progressive student of digits-flow (flow Euler 16 -> 8 -> 4 steps,
# guidance 1.5 baked in), then one `fastdiff bench` run, three alternating timed rounds per config (min and max
# kept for every ratio) after an untimed warm-up:
# the teacher at 28 and at 4 steps, the student, and the student under each accelerator that applies to it, with
# accuracy and FD on every row (weight changers such as quantize are refused beside a student: both change the
# denoiser's weights). Results: benchmarks/results/flow_student.json (student training:
# ROOT/student/fastdiff_distill.json).
#   sh benchmarks/flow_student.sh [ROOT] [IMAGES]      (defaults /tmp/fastdiff-flow-student, 100 images)
set -e
root=${1:-/tmp/fastdiff-flow-student}
images=${2:-100}
fd=${FASTDIFF:-.venv/bin/fastdiff}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
mkdir -p "$root"
[ -f "$root/digits-flow/model_index.json" ] || $fd zoo build digits-flow "$root/digits-flow" --size bench
if ! grep -qs '"done": true' "$root/student/fastdiff_distill.json"; then
  resume=""
  [ -d "$root/student" ] && resume=--resume
  $fd distill progressive "$root/digits-flow" "$root/student" --from 16 --to 4 --guidance 1.5 \
    --steps-per-round "${ROUND_STEPS:-150}" --batch "${BATCH:-8}" --pool "${POOL:-128}" --save-every 100 $resume
fi
s="student(path=$root/student/steps-4)"
$fd bench "$root/digits-flow" --guidance 1.5 --threads 1 --runs 3 --seed 0 --batch "$images" \
  --json "${OUT:-benchmarks/results/flow_student.json}" \
  --config "teacher flow-euler 28=scheduler(name=flow-euler,steps=28)" \
  --config "teacher flow-euler 4=scheduler(name=flow-euler,steps=4)" \
  --config "student 4=$s" \
  --config "student + first-block 0.2=$s;blockcache(mode=first-block,threshold=0.2)" \
  --config "student + interval 2=$s;blockcache(mode=interval,interval=2)" \
  --config "student + teacache 0.3=$s;blockcache(mode=teacache,threshold=0.3)" \
  --config "student + forecast 2=$s;forecast(order=1,interval=2,warmup=2)" \
  --config "student + compile=$s;compile" \
  --config "student + promptcache=$s;promptcache"
