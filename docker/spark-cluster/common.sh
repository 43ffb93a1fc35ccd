# Shared by start-cluster.sh, submit.sh and stop-cluster.sh (sourced, not run).
# Resolves the project's Python and the pip PySpark's SPARK_HOME, and points Spark's daemon
# scripts at the cluster directory: DIR/logs, DIR/pids, DIR/work (worker scratch), DIR/local.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
die() { printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }
# A bad command line: one line on stderr and exit 2, before anything is started.
usage_error() { printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2; exit 2; }
# usage_error unless $2 (named $1 in the message) is a whole number in [$3, $4 (default: no limit)].
need_int() {
  [[ "$2" =~ ^[0-9]{1,9}$ ]] && (( 10#$2 >= $3 && 10#$2 <= ${4:-999999999} )) \
    || usage_error "$1 must be a whole number from $3${4:+ to $4}, got '$2'"
}

# A directory of this user's, mode 0700, created if missing; refused when it exists as another
# user's or as a symbolic link (whoever made it first could read or replace the daemons' files).
private_dir() {
  local dir="$1"
  (umask 077 && mkdir -p "$dir")
  [[ -d "$dir" && ! -L "$dir" ]] || die "$dir is not a directory of its own (a symbolic link or a file)"
  [[ -O "$dir" ]] || die "$dir belongs to another user ($(stat -c %U "$dir")): choose another --dir"
  chmod 0700 "$dir"
}

use_cluster_dir() {
  local dir="$1"
  private_dir "$dir"
  CLUSTER_DIR="$(cd "$dir" && pwd)"
  # Spark's sbin/spark-daemon.sh redirects to unquoted paths: whitespace breaks every daemon.
  [[ "$CLUSTER_DIR" != *[[:space:]]* ]] \
    || usage_error "--dir '$CLUSTER_DIR' contains whitespace, which Spark's daemon scripts cannot handle"
  SPARK_HOME="$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" \
    || die "PySpark is not importable by $PYTHON (set PYTHON=...)"
  export SPARK_HOME
  export SPARK_LOG_DIR="$CLUSTER_DIR/logs" SPARK_PID_DIR="$CLUSTER_DIR/pids"
  export SPARK_WORKER_DIR="$CLUSTER_DIR/work" SPARK_LOCAL_DIRS="$CLUSTER_DIR/local"
  # The pid files are named after this: distinct per directory, so clusters never collide.
  export SPARK_IDENT_STRING="criteo-$(printf '%s' "$CLUSTER_DIR" | cksum | cut -d' ' -f1)"
  export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYTHON}" PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PYTHON}"
  # Executors' logs and files, the daemons' logs and pid files: this user's only.
  local sub
  for sub in "$SPARK_LOG_DIR" "$SPARK_PID_DIR" "$SPARK_WORKER_DIR" "$SPARK_LOCAL_DIRS"; do
    private_dir "$sub"
  done
}
