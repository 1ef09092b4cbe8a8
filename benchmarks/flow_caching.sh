#!/bin/sh
# fastdiff's and diffusers' caches on digits-flow at matched settings, the configs split over two processes side by
# side (one thread each, each with its own flow Euler 28 baseline), merged into benchmarks/results/flow_caching.json.
# The configs: the digits-flow preset of benchmarks/caching_pair.py. No diffusers first-block cache here:
# FirstBlockCacheConfig fails on SD3Transformer2DModel (its last joint block returns no text states).
#   sh benchmarks/flow_caching.sh MODEL [IMAGES]      (MODEL: e.g. `fastdiff zoo build digits-flow DIR --size bench`)
set -e
exec ${PYTHON:-.venv/bin/python} benchmarks/caching_pair.py digits-flow "${1:?usage: flow_caching.sh MODEL [IMAGES]}" \
  --count "${2:-100}"
