#!/usr/bin/env bash
# Starts a Spark standalone master and N workers on this machine with the pip PySpark's own
# daemon scripts (sbin/spark-daemon.sh: the pip package has no start-master.sh/start-worker.sh).
#
#   start-cluster.sh --dir DIR [--host 127.0.0.1] [--port 7077] [--webui-port 8080]
#                    [--workers 1] [--worker-cores 2] [--worker-memory 4g]
#                    [--worker-webui-port 8081] [--timeout 120]
#
# Logs go to DIR/logs, pid files to DIR/pids; DIR/cluster.env records the master URL for
# submit.sh and stop-cluster.sh. Prints the master URL when every worker has registered.
# On several machines, run the master here and point workers at it (docs/cluster.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DIR="" HOST=127.0.0.1 PORT=7077 WEBUI_PORT=8080 WORKERS=1 CORES=2 MEMORY=4g WORKER_WEBUI_PORT=8081 TIMEOUT=120
while [[ $# -gt 0 ]]; do
  [[ "$1" == -h || "$1" == --help || $# -ge 2 ]] || usage_error "$1 needs a value (see --help)"
  case "$1" in
    --dir) DIR="$2" ;;
    --host) HOST="$2" ;;
    --port) PORT="$2" ;;
    --webui-port) WEBUI_PORT="$2" ;;
    --workers) WORKERS="$2" ;;
    --worker-cores) CORES="$2" ;;
    --worker-memory) MEMORY="$2" ;;
    --worker-webui-port) WORKER_WEBUI_PORT="$2" ;;
    --timeout) TIMEOUT="$2" ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) usage_error "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[[ -n "$DIR" ]] || usage_error "--dir DIR is required (logs, pids and cluster.env go there)"
need_int --port "$PORT" 1 65535; need_int --webui-port "$WEBUI_PORT" 1 65535
need_int --worker-webui-port "$WORKER_WEBUI_PORT" 1 65535; need_int --workers "$WORKERS" 0
need_int --worker-cores "$CORES" 1; need_int --timeout "$TIMEOUT" 1
[[ "$MEMORY" =~ ^[1-9][0-9]*[kKmMgGtT]$ ]] || usage_error "--worker-memory must be a size like 4g or 512m, got '$MEMORY'"
use_cluster_dir "$DIR"
# A cluster already running from this directory: spark-daemon.sh would refuse on stdout only.
for file in "$SPARK_PID_DIR"/*.pid; do
  if [[ -f "$file" ]] && kill -0 "$(cat "$file")" 2>/dev/null; then
    die "a daemon of this cluster directory is still running (pid $(cat "$file")): stop-cluster.sh --dir $DIR first"
  fi
done
MASTER_URL="spark://$HOST:$PORT"
DAEMON="$SPARK_HOME/sbin/spark-daemon.sh"
MASTER_CLASS=org.apache.spark.deploy.master.Master
WORKER_CLASS=org.apache.spark.deploy.worker.Worker

# Fail fast and clearly when a port is taken (otherwise the master silently picks another).
"$PYTHON" - "$HOST" "$PORT" "$WEBUI_PORT" <<'PY' || die "a master port is in use on $HOST (choose --port/--webui-port)"
import socket, sys
for port in sys.argv[2:]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[1], int(port)))
PY

cat >"$CLUSTER_DIR/cluster.env" <<ENV
MASTER_URL=$MASTER_URL
MASTER_WEBUI=http://$HOST:$WEBUI_PORT
WORKERS=$WORKERS
ENV

export SPARK_MASTER_HOST="$HOST"
"$DAEMON" start "$MASTER_CLASS" 1 --host "$HOST" --port "$PORT" --webui-port "$WEBUI_PORT" >/dev/null
for ((i = 1; i <= WORKERS; i++)); do
  "$DAEMON" start "$WORKER_CLASS" "$i" --host "$HOST" --webui-port "$((WORKER_WEBUI_PORT + i - 1))" \
    --cores "$CORES" --memory "$MEMORY" --work-dir "$SPARK_WORKER_DIR" "$MASTER_URL" >/dev/null
done

# Ready when each worker's log says it registered with the master.
deadline=$((SECONDS + TIMEOUT))
while :; do
  registered=$( (grep -l "Successfully registered with master" "$SPARK_LOG_DIR"/*Worker*.out 2>/dev/null || true) | wc -l)
  [[ "$registered" -ge "$WORKERS" ]] && break
  if [[ $SECONDS -ge $deadline ]]; then
    tail -n 20 "$SPARK_LOG_DIR"/*.out >&2 || true
    die "$registered of $WORKERS worker(s) registered with $MASTER_URL within ${TIMEOUT}s (logs: $SPARK_LOG_DIR)"
  fi
  sleep 1
done
echo "$MASTER_URL"
