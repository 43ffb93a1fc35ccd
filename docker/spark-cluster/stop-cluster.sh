#!/usr/bin/env bash
# Stops the workers and the master that start-cluster.sh --dir DIR started, by their pid files
# in DIR/pids (never by name), and waits until they have exited (SIGKILL after --timeout
# seconds). Safe to run twice or after a failed start.
#
#   stop-cluster.sh --dir DIR [--timeout 30]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ "${1:-}" == "--dir" && -n "${2:-}" ]] || usage_error "usage: stop-cluster.sh --dir DIR [--timeout 30]"
[[ -d "$2" ]] || usage_error "$2 is not a cluster directory"
TIMEOUT=30
if [[ $# -gt 2 ]]; then
  [[ "$3" == "--timeout" && $# -eq 4 ]] || usage_error "usage: stop-cluster.sh --dir DIR [--timeout 30]"
  TIMEOUT="$4"
fi
need_int --timeout "$TIMEOUT" 0
use_cluster_dir "$2"
WORKERS="$(sed -n 's/^WORKERS=//p' "$CLUSTER_DIR/cluster.env" 2>/dev/null || true)"
# The worker instances to stop: cluster.env's count, or (if that is unreadable) the pid files'.
if ! [[ "$WORKERS" =~ ^[0-9]+$ ]]; then
  WORKERS="$(find "$SPARK_PID_DIR" -name '*Worker-*.pid' | sed 's/.*Worker-\([0-9]*\)\.pid$/\1/' | sort -n | tail -n 1)"
fi
DAEMON="$SPARK_HOME/sbin/spark-daemon.sh"

PIDS=()
for file in "$SPARK_PID_DIR"/*.pid; do
  [[ -f "$file" ]] && PIDS+=("$(cat "$file")")
done
for ((i = 1; i <= ${WORKERS:-0}; i++)); do
  "$DAEMON" stop org.apache.spark.deploy.worker.Worker "$i" || true
done
"$DAEMON" stop org.apache.spark.deploy.master.Master 1 || true

alive() { local p; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && echo "$p"; done; return 0; }
deadline=$((SECONDS + TIMEOUT))
while [[ -n "$(alive)" && $SECONDS -lt $deadline ]]; do sleep 1; done
left="$(alive)"
if [[ -n "$left" ]]; then
  echo "stop-cluster.sh: killing daemons that ignored SIGTERM: $left" >&2
  kill -9 $left 2>/dev/null || true
fi
rm -f "$SPARK_PID_DIR"/*.pid
