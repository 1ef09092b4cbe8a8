#!/bin/sh
# fastdiff's and diffusers' caches on digits-flow at matched settings, the configs split over two processes side by
# side (one thread each, each with its own flow Euler 28 baseline), merged into benchmarks/results/flow_caching.json.
# No diffusers first-block cache here: FirstBlockCacheConfig fails on SD3Transformer2DModel (its last joint block
# returns no text states; TypeError in diffusers/hooks/first_block_cache.py).
#   sh benchmarks/flow_caching.sh MODEL [IMAGES]      (MODEL: e.g. `fastdiff zoo build digits-flow DIR --size bench`)
set -e
model=${1:?usage: flow_caching.sh MODEL [IMAGES]}
images=${2:-100}
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
HF_HUB_OFFLINE=1 $py benchmarks/flow_caching.py --model "$model" --images "$images" --runs 1 --out "$tmp/1.json" \
  --config euler-28=none --config "fd-forecast-3=forecast(order=1,interval=3,warmup=3)" \
  --config hf-taylorseer-3=hf-taylorseer:3:3:1 --config "fd-teacache-0.12=blockcache(mode=teacache,threshold=0.12)" \
  --config hf-magcache-0.15=hf-magcache:0.15:3 --config "fd-teacache-0.3=blockcache(mode=teacache,threshold=0.3)" \
  > "$tmp/1.log" 2>&1 &
HF_HUB_OFFLINE=1 $py benchmarks/flow_caching.py --model "$model" --images "$images" --runs 1 --out "$tmp/2.json" \
  --config euler-28=none --config "fd-forecast-2=forecast(order=1,interval=2,warmup=2)" \
  --config hf-taylorseer-2=hf-taylorseer:2:2:1 --config "fd-first-block-0.2=blockcache(mode=first-block,threshold=0.2)" \
  --config "fd-interval-2=blockcache(mode=interval,interval=2)" \
  > "$tmp/2.log" 2>&1 &
wait
$py - "$tmp" "$model" "$images" <<'PY'
import json, sys
from datetime import date
tmp, model, images = sys.argv[1:]
first, second = (json.load(open(f"{tmp}/{i}.json")) for i in (1, 2))
base = second["rows"][0]
out = dict(first, model=model, date=str(date.today()), device="2-core CPU, 1 torch thread per process",
           command=f"sh benchmarks/flow_caching.sh MODEL {images}", label="digits-flow",
           split=("two processes side by side, each with its own euler-28 baseline (the second's: "
                  f"{base['cpu_median']} CPU s, FD {base['fd']:.2f}); speedup and PSNR against the own process's"),
           rows=[dict(r, process=1) for r in first["rows"]] + [dict(r, process=2) for r in second["rows"][1:]])
json.dump(out, open("benchmarks/results/flow_caching.json", "w"), indent=1)
for r in out["rows"]:
    print(f"{r['name']:22s} {r['speedup']:6.2f}x computed {r['computed']:.3f} acc {r['accuracy']:.3f} "
          f"FD {r['fd']:6.2f} PSNR {r['psnr']}")
PY
