# Sourced by the one-step scripts (benchmarks/onestep_*.sh), after ROOT is set: run a training command once.
done_run() { [ -f "$1/fastdiff_distill.json" ] && grep -q '"done": true' "$1/fastdiff_distill.json"; }
run() {  # run NAME CMD...: skip a finished run, resume an interrupted one; wall time and peak RSS in ROOT/time-NAME.txt
  local name=$1; shift
  if done_run "$ROOT/$name"; then echo "== $name: done"; return; fi
  local resume=""; [ -d "$ROOT/$name" ] && resume="--resume"
  echo "== $name $(date +%T)"
  /usr/bin/time -o "$ROOT/time-$name.txt" -f "$name: %e s wall, peak RSS %M KiB" "$@" $resume
  cat "$ROOT/time-$name.txt"
}
