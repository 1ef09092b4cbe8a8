#!/bin/sh
# fastdiff's and diffusers' caches on moving-digits at matched settings, the configs split over two processes side
# by side (one thread each, each with its own UniPC 50 baseline at guidance 5: WanPipeline's defaults), merged into
# benchmarks/results/video_caching.json. The configs: the moving-digits preset of benchmarks/caching_pair.py;
# TeaCache uses the polynomial fitted on this model (`fastdiff fit-teacache MODEL --steps 50 --guidance 5 --out FIT`).
#   sh benchmarks/video_caching.sh MODEL [CLIPS]   (MODEL: `fastdiff zoo build moving-digits DIR --size bench`)
set -e
exec ${PYTHON:-.venv/bin/python} benchmarks/caching_pair.py moving-digits "${1:?usage: video_caching.sh MODEL [CLIPS]}" \
  --count "${2:-200}"
