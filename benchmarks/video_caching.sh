#!/bin/sh
# fastdiff's and diffusers' caches on moving-digits (Wan's UniPC 50 at the model's bench guidance): each family's
# setting chosen on selection seed 0 (one round), then the baseline and the picks reported on seed 1 in 3
# alternating rounds, one process, one thread (benchmarks/caching_select.py --preset moving-digits). TeaCache uses
# the polynomial fitted on this model (benchmarks/results/moving_digits_teacache_fit.json, fitted at guidance 5).
# Writes benchmarks/results/video_caching_selection.json and video_caching.json.
#   sh benchmarks/video_caching.sh MODEL [CLIPS]   (MODEL: `fastdiff zoo build moving-digits DIR --size bench`)
set -e
exec ${PYTHON:-.venv/bin/python} -m benchmarks.caching_select "${1:?usage: video_caching.sh MODEL [CLIPS]}" \
  --preset moving-digits --images "${2:-100}"
