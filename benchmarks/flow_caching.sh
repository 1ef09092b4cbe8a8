#!/bin/sh
# fastdiff's and diffusers' caches on digits-flow: each family's setting chosen on selection seed 0 (one round),
# then the baseline and the picks reported on seed 1 in 3 alternating rounds, one process, one thread
# (benchmarks/caching_select.py). Writes benchmarks/results/flow_caching_selection.json and flow_caching.json.
# No diffusers first-block cache here: FirstBlockCacheConfig fails on SD3Transformer2DModel (its last joint block
# returns no text states); benchmarks/results/flow_caching_first_block.json runs it with a pass-through hook.
#   sh benchmarks/flow_caching.sh MODEL [IMAGES]      (MODEL: e.g. `fastdiff zoo build digits-flow DIR --size bench`)
set -e
exec ${PYTHON:-.venv/bin/python} -m benchmarks.caching_select "${1:?usage: flow_caching.sh MODEL [IMAGES]}" \
  --images "${2:-100}"
