#!/bin/sh
# fastdiff's and diffusers' caches on moving-digits at matched settings, the configs split over two processes side
# by side (one thread each, each with its own UniPC 50 baseline: Wan's default sampler and steps), merged into
# benchmarks/results/video_caching.json. TeaCache uses the rescaling polynomial fitted on this model
# (benchmarks/results/moving_digits_teacache_fit.json: `fastdiff fit-teacache MODEL --steps 50 --out FIT`).
#   sh benchmarks/video_caching.sh MODEL [CLIPS]   (MODEL: `fastdiff zoo build moving-digits DIR --size bench`)
set -e
model=${1:?usage: video_caching.sh MODEL [CLIPS]}
clips=${2:-200}
py=${PYTHON:-.venv/bin/python}
fit=benchmarks/results/moving_digits_teacache_fit.json
tmp=$(mktemp -d)
HF_HUB_OFFLINE=1 $py benchmarks/flow_caching.py --model "$model" --steps 50 --images "$clips" --runs 1 \
  --out "$tmp/1.json" --config unipc-50=none \
  --config "fd-forecast-3=forecast(order=1,interval=3,warmup=3)" --config hf-taylorseer-3=hf-taylorseer:3:3:1 \
  --config "fd-teacache-0.1=blockcache(mode=teacache,threshold=0.1,fit=$fit)" \
  --config "hf-magcache-0.1=hf-magcache:0.1:3" \
  --config "fd-teacache-0.2=blockcache(mode=teacache,threshold=0.2,fit=$fit)" \
  > "$tmp/1.log" 2>&1 &
HF_HUB_OFFLINE=1 $py benchmarks/flow_caching.py --model "$model" --steps 50 --images "$clips" --runs 1 \
  --out "$tmp/2.json" --config unipc-50=none \
  --config "fd-forecast-2=forecast(order=1,interval=2,warmup=2)" --config hf-taylorseer-2=hf-taylorseer:2:2:1 \
  --config "fd-first-block-0.1=blockcache(mode=first-block,threshold=0.1)" \
  --config "hf-fbc-0.1=hf-fbc:0.1" \
  --config "fd-interval-2=blockcache(mode=interval,interval=2)" \
  > "$tmp/2.log" 2>&1 &
wait
$py - "$tmp" "$clips" <<'PY'
import json, sys
from datetime import date
tmp, clips = sys.argv[1:]
first, second = (json.load(open(f"{tmp}/{i}.json")) for i in (1, 2))
base = second["rows"][0]
out = dict(first, model="moving-digits", date=str(date.today()), device="2-core CPU, 1 torch thread per process",
           command=f"sh benchmarks/video_caching.sh MODEL {clips}", label="moving-digits",
           split=("two processes side by side, each with its own unipc-50 baseline (the second's: "
                  f"{base['cpu_median']} CPU s, FD {base['fd']:.2f}); speedup and PSNR against the own process's"),
           rows=[dict(r, process=1) for r in first["rows"]] + [dict(r, process=2) for r in second["rows"][1:]])
json.dump(out, open("benchmarks/results/video_caching.json", "w"), indent=1)
for r in out["rows"]:
    print(f"{r['name']:22s} {r['speedup']:6.2f}x computed {r['computed']:.3f} acc {r['accuracy']:.3f} "
          f"dir {r['direction_accuracy']:.3f} FD {r['fd']:6.2f} temporal {r['temporal_ratio']:.3f} PSNR {r['psnr']}")
PY
