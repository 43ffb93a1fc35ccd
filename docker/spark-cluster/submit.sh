#!/usr/bin/env bash
# Runs the preprocessing on the cluster started by start-cluster.sh, through spark-submit:
#
#   submit.sh --dir DIR [spark-submit options...] -- --input RAW --workdir OUT [spark_jobs flags]
#
# Everything before "--" goes to spark-submit (e.g. --driver-memory 8g --executor-memory 4g
# --total-executor-cores 4 --conf k=v); everything after it to spark_jobs/main.py.
# On an authenticated cluster (cluster.env AUTH=on) the job gets the cluster's secret *file*
# (--auth-secret-file; the job hands the secret to its JVM itself, never on a command line) and
# the cluster's encryption and UI ACL settings. The driver binds to the cluster's --host, its
# web UI to 127.0.0.1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ "${1:-}" == "--dir" && -n "${2:-}" ]] || usage_error "usage: submit.sh --dir DIR [spark-submit options] -- [spark_jobs flags]"
DIR="$2"; shift 2
[[ -f "$DIR/cluster.env" ]] || die "$DIR/cluster.env not found: start the cluster with start-cluster.sh --dir $DIR"
use_cluster_dir "$DIR"
setting() { sed -n "s/^$1=//p" "$CLUSTER_DIR/cluster.env"; }
MASTER_URL="$(setting MASTER_URL)"
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
if [[ "$(setting AUTH)" == on ]]; then
  SECRET_FILE="$(setting SECRET_FILE)"
  [[ -f "$SECRET_FILE" ]] || die "the cluster's secret file '$SECRET_FILE' is missing: restart the cluster with start-cluster.sh --dir $DIR"
  APP_ARGS+=(--auth-secret-file "$SECRET_FILE")
  [[ "$(setting RPC_ENCRYPTION)" == on ]] || APP_ARGS+=(--no-rpc-encryption)
fi
# A cluster started with --insecure: the job says so too (a job refuses an unauthenticated
# master off loopback otherwise; on loopback the flag changes nothing).
[[ "$(setting AUTH)" == off ]] && APP_ARGS+=(--insecure)
[[ "$(setting IO_ENCRYPTION)" == on ]] && APP_ARGS+=(--io-encryption)
ADMIN_USERS="$(setting ADMIN_USERS)" VIEW_USERS="$(setting VIEW_USERS)"
[[ -n "$ADMIN_USERS" ]] && APP_ARGS+=(--ui-admin-users "$ADMIN_USERS")
[[ -n "$VIEW_USERS" ]] && APP_ARGS+=(--ui-view-users "$VIEW_USERS")
HOST="$(setting HOST)"
# The driver's RPC endpoint binds to the cluster's address, its web UI to loopback only (Spark
# binds UIs to SPARK_LOCAL_IP, else to every interface): an SSH tunnel reaches it (cluster.md).
if [[ -n "$HOST" ]]; then
  export SPARK_LOCAL_IP=127.0.0.1
  SUBMIT_OPTS=(--conf "spark.driver.host=$HOST" --conf "spark.driver.bindAddress=$HOST"
               ${SUBMIT_OPTS[@]+"${SUBMIT_OPTS[@]}"})
fi
exec "$SPARK_HOME/bin/spark-submit" --master "$MASTER_URL" "${SUBMIT_OPTS[@]}" \
  "$ROOT/spark_jobs/main.py" "${APP_ARGS[@]}"
