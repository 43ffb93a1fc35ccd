#!/usr/bin/env bash
# Starts a Spark standalone master and N workers on this machine with the pip PySpark's own
# daemon scripts (sbin/spark-daemon.sh: the pip package has no start-master.sh/start-worker.sh).
#
#   start-cluster.sh --dir DIR [--host 127.0.0.1] [--port 7077] [--webui-port 8080]
#                    [--workers 1] [--worker-cores 2] [--worker-memory 4g]
#                    [--worker-webui-port 8081] [--timeout 120] [--join spark://HOST:PORT]
#                    [--authenticate | --insecure] [--secret-file FILE] [--no-rpc-encryption]
#                    [--io-encryption] [--admin-users U1,U2] [--view-users U3,U4]
#
# Off a loopback --host the cluster authenticates every connection with a shared secret
# (DIR/auth/secret, mode 0600, created once; or --secret-file FILE) and encrypts RPC traffic;
# --insecure turns that off, --authenticate turns it on for a loopback address too (off loopback
# --no-rpc-encryption needs --insecure). Web UIs bind to 127.0.0.1 only, with ACLs on and no
# kill buttons; the REST submission server stays off.
# --join URL starts only workers, for the master at URL (another node; same --secret-file).
# Logs go to DIR/logs, pid files to DIR/pids; DIR/cluster.env records the master URL and the
# (non-secret) security settings for submit.sh and stop-cluster.sh. Prints the master URL when
# every worker has registered. Several machines: docs/cluster.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DIR="" HOST=127.0.0.1 PORT=7077 WEBUI_PORT=8080 WORKERS=1 CORES=2 MEMORY=4g WORKER_WEBUI_PORT=8081 TIMEOUT=120
JOIN="" AUTH_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in  # switches first: they take no value
    --authenticate|--insecure|--no-rpc-encryption|--io-encryption) AUTH_ARGS+=("$1"); shift; continue ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
  esac
  [[ $# -ge 2 ]] || usage_error "$1 needs a value (see --help)"
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
    --join) JOIN="$2" ;;
    --secret-file|--admin-users|--view-users) AUTH_ARGS+=("$1" "$2") ;;
    *) usage_error "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[[ -n "$DIR" ]] || usage_error "--dir DIR is required (logs, pids and cluster.env go there)"
need_int --port "$PORT" 1 65535; need_int --webui-port "$WEBUI_PORT" 1 65535
need_int --worker-webui-port "$WORKER_WEBUI_PORT" 1 65535; need_int --workers "$WORKERS" 0
need_int --worker-cores "$CORES" 1; need_int --timeout "$TIMEOUT" 1
[[ "$MEMORY" =~ ^[1-9][0-9]*[kKmMgGtT]$ ]] || usage_error "--worker-memory must be a size like 4g or 512m, got '$MEMORY'"
[[ -z "$JOIN" || "$JOIN" =~ ^spark://[^[:space:]/]+:[0-9]+$ ]] || usage_error "--join must be a master URL spark://HOST:PORT, got '$JOIN'"
[[ -z "$JOIN" || "$WORKERS" -ge 1 ]] || usage_error "--join starts workers only: --workers must be at least 1"
use_cluster_dir "$DIR"
# A cluster already running from this directory: spark-daemon.sh would refuse on stdout only.
for file in "$SPARK_PID_DIR"/*.pid; do
  if [[ -f "$file" ]] && kill -0 "$(cat "$file")" 2>/dev/null; then
    die "a daemon of this cluster directory is still running (pid $(cat "$file")): stop-cluster.sh --dir $DIR first"
  fi
done
MASTER_URL="${JOIN:-spark://$HOST:$PORT}"
DAEMON="$SPARK_HOME/sbin/spark-daemon.sh"
MASTER_CLASS=org.apache.spark.deploy.master.Master
WORKER_CLASS=org.apache.spark.deploy.worker.Worker

# Fail fast and clearly when a port is taken (otherwise the master silently picks another).
[[ -n "$JOIN" ]] || "$PYTHON" - "$HOST" "$PORT" "$WEBUI_PORT" <<'PY' || die "a master port is in use on $HOST (choose --port/--webui-port)"
import socket, sys
for port in sys.argv[2:]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[1], int(port)))
PY

# The secret and the daemons' properties file (DIR/auth, mode 0700; the secret never passes
# through this script); prints the non-secret settings for cluster.env.
SECURITY="$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m pipeline.cluster_auth prepare \
  --dir "$CLUSTER_DIR/auth" --host "$HOST" ${AUTH_ARGS[@]+"${AUTH_ARGS[@]}"})" || exit $?
DAEMON_CONF="$(sed -n 's/^DAEMON_CONF=//p' <<<"$SECURITY")"

cat >"$CLUSTER_DIR/cluster.env" <<ENV
MASTER_URL=$MASTER_URL
MASTER_WEBUI=http://127.0.0.1:$WEBUI_PORT
HOST=$HOST
WORKERS=$WORKERS
$SECURITY
ENV

# Every daemon binds to --host only, every web UI to 127.0.0.1 (Spark binds UIs to
# SPARK_LOCAL_IP, else to 0.0.0.0; its ACLs restrict nobody without an authentication filter):
# an SSH tunnel reaches them (docs/cluster.md §2.2).
export SPARK_MASTER_HOST="$HOST" SPARK_LOCAL_IP=127.0.0.1
if [[ -z "$JOIN" ]]; then
  "$DAEMON" start "$MASTER_CLASS" 1 --host "$HOST" --port "$PORT" --webui-port "$WEBUI_PORT" \
    --properties-file "$DAEMON_CONF" >/dev/null
fi
for ((i = 1; i <= WORKERS; i++)); do
  "$DAEMON" start "$WORKER_CLASS" "$i" --host "$HOST" --webui-port "$((WORKER_WEBUI_PORT + i - 1))" \
    --cores "$CORES" --memory "$MEMORY" --work-dir "$SPARK_WORKER_DIR" \
    --properties-file "$DAEMON_CONF" "$MASTER_URL" >/dev/null
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
