#!/usr/bin/env bash
# Spark GPU discovery script (spark.{driver,executor}.resource.gpu.discoveryScript): prints the
# GPU addresses nvidia-smi sees as the JSON Spark expects, e.g. {"name":"gpu","addresses":["0","1"]}.
# The pip PySpark does not ship Spark's examples/ copy, so the GPU image installs this one there
# (where spark_jobs/gpu.py looks for it).
set -euo pipefail
addresses="$(nvidia-smi --query-gpu=index --format=csv,noheader | sed -e 's/^[[:space:]]*//' -e 's/.*/"&"/' | paste -sd, -)"
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
