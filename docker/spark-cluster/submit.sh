#!/usr/bin/env bash
# Runs the preprocessing on the cluster started by start-cluster.sh, through spark-submit:
#
#   submit.sh --dir DIR [spark-submit options...] -- --input RAW --workdir OUT [spark_jobs flags]
#
# Everything before "--" goes to spark-submit (e.g. --driver-memory 8g --executor-memory 4g
# --total-executor-cores 4 --conf k=v); everything after it to spark_jobs/main.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ "${1:-}" == "--dir" && -n "${2:-}" ]] || usage_error "usage: submit.sh --dir DIR [spark-submit options] -- [spark_jobs flags]"
DIR="$2"; shift 2
[[ -f "$DIR/cluster.env" ]] || die "$DIR/cluster.env not found: start the cluster with start-cluster.sh --dir $DIR"
use_cluster_dir "$DIR"
MASTER_URL="$(sed -n 's/^MASTER_URL=//p' "$CLUSTER_DIR/cluster.env")"
[[ -n "$MASTER_URL" ]] || die "$CLUSTER_DIR/cluster.env has no MASTER_URL: restart the cluster with start-cluster.sh --dir $DIR"
SUBMIT_OPTS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do SUBMIT_OPTS+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
# The job's own --master gets the same URL, so its recorded configuration names the real master
# (under spark-submit the job keeps spark-submit's master whatever its own flag says).
APP_ARGS=("$@")
HAS_MASTER=0
for arg in "${APP_ARGS[@]}"; do [[ "$arg" == --master || "$arg" == --master=* ]] && HAS_MASTER=1; done
[[ $HAS_MASTER -eq 1 ]] || APP_ARGS+=(--master "$MASTER_URL")
exec "$SPARK_HOME/bin/spark-submit" --master "$MASTER_URL" "${SUBMIT_OPTS[@]}" \
  "$ROOT/spark_jobs/main.py" "${APP_ARGS[@]}"
