#!/usr/bin/env bash
# TensorFlow Serving for the exported DLRM: checks the mounted model first, so a missing or
# misplaced export is one clear line (exit 2), not a server waiting forever for a version.
#   MODEL_NAME (dlrm), MODEL_BASE_PATH (/models): the model is $MODEL_BASE_PATH/$MODEL_NAME/<N>/
# with N a number: the workdir's DIR/export (one version directory per export) mounted as
# /models/dlrm. Extra arguments go to tensorflow_model_server.
#
# Which version is served: the one DIR/export/serving.json names as "served_version" (the
# version a rollback holds, else the newest verified one; `run_pipeline.sh export ...`,
# docs/pipeline.md); without serving.json (an export made before it existed) the newest. The
# server gets a model config file naming exactly that version, written here and rewritten
# whenever the served version changes; it reads it again every SERVING_POLL_SECONDS (30), so
# a rollback or a new export is followed without a restart, and a version is never loaded
# because it appeared in the directory.
#
# A model directory is code (TensorFlow ops can read and write files): every version present at
# start, and each version before the server is switched to it, must hash to the content_sha256
# its fingerprint.json records (the export stage writes it; dlrm_contracts/model_digest.py
# defines it). At start a version that does not stops the server; later, the switch is not
# made (the current version keeps serving) and the reason is printed. Only the pipeline's user
# may write the export directory (docs/cluster.md, "Serving").
#
# Where it listens (TensorFlow Serving itself listens on every interface of the container, or
# on a UNIX socket, nothing in between):
#   SERVING_ADDRESS  127.0.0.1 (the default outside Kubernetes): no TCP port at all, gRPC on the
#                    UNIX socket SERVING_SOCKET (default $HOME/grpc.sock), for a sidecar or a
#                    process sharing the volume; 0.0.0.0 (the default under Kubernetes): gRPC on
#                    8500 and REST on 8501 of the container's interfaces, for an ingress or a
#                    sidecar that adds TLS and authentication, or `docker run -p 127.0.0.1:8501:8501`.
# Limits (requests beyond them are refused, not queued without end):
#   SERVING_MAX_REQUEST_BYTES (4194304)  largest gRPC request (grpc.max_receive_message_length);
#                                        REST bodies are bounded by the proxy in front
#   SERVING_MAX_BATCH_SIZE (4096)        most lines in one request and in one batch
#   SERVING_BATCH_TIMEOUT_MICROS (1000)  longest wait to fill a batch
#   SERVING_MAX_ENQUEUED_BATCHES (64)    batches waiting; beyond that requests are refused
#   SERVING_BATCH_THREADS (CPUs)         batches run at once
#   SERVING_TIMEOUT_MS (10000)           REST request timeout
#   SERVING_REST_THREADS (4 x CPUs)      REST threads
set -euo pipefail
MODEL_NAME="${MODEL_NAME:-dlrm}"
MODEL_BASE_PATH="${MODEL_BASE_PATH:-/models}"
model_dir="$MODEL_BASE_PATH/$MODEL_NAME"
state="$model_dir/serving.json"
fail() { echo "serving: $*" >&2; exit 2; }

whole() {  # NAME VALUE MIN: VALUE, or exit 2 unless a whole number >= MIN
  [[ "$2" =~ ^[0-9]{1,10}$ ]] && (( 10#$2 >= $3 )) || fail "$1 must be a whole number >= $3, got '$2'"
  echo $((10#$2))
}
cpus="$(nproc 2>/dev/null || echo 1)"
max_request="$(whole SERVING_MAX_REQUEST_BYTES "${SERVING_MAX_REQUEST_BYTES:-4194304}" 1024)"
max_batch="$(whole SERVING_MAX_BATCH_SIZE "${SERVING_MAX_BATCH_SIZE:-4096}" 1)"
batch_timeout="$(whole SERVING_BATCH_TIMEOUT_MICROS "${SERVING_BATCH_TIMEOUT_MICROS:-1000}" 0)"
max_enqueued="$(whole SERVING_MAX_ENQUEUED_BATCHES "${SERVING_MAX_ENQUEUED_BATCHES:-64}" 1)"
batch_threads="$(whole SERVING_BATCH_THREADS "${SERVING_BATCH_THREADS:-$cpus}" 1)"
timeout_ms="$(whole SERVING_TIMEOUT_MS "${SERVING_TIMEOUT_MS:-10000}" 1)"
poll="$(whole SERVING_POLL_SECONDS "${SERVING_POLL_SECONDS:-30}" 1)"
rest_threads="$(whole SERVING_REST_THREADS "${SERVING_REST_THREADS:-$((4 * cpus))}" 1)"

if [[ -n "${KUBERNETES_SERVICE_HOST:-}" ]]; then default_address=0.0.0.0; else default_address=127.0.0.1; fi
address="${SERVING_ADDRESS:-$default_address}"
case "$address" in
  127.0.0.1|::1|localhost)
    socket="${SERVING_SOCKET:-${HOME:?HOME is not set: name the socket with SERVING_SOCKET}/grpc.sock}"
    listen=(--port=0 --rest_api_port=0 "--grpc_socket_path=$socket")
    note="serving: no TCP port (SERVING_ADDRESS=$address): gRPC on the UNIX socket $socket" ;;
  0.0.0.0|::)
    listen=(--port=8500 --rest_api_port=8501)
    note="serving: gRPC 8500 and REST 8501 on every interface of the container: TLS and authentication belong in front (docs/cluster.md, \"Serving\")" ;;
  *)
    fail "SERVING_ADDRESS=$address: TensorFlow Serving cannot listen on one address; use 127.0.0.1 (a UNIX socket, no TCP port) or 0.0.0.0 and publish the ports on the address you choose (docker run -p $address:8501:8501)" ;;
esac

shopt -s nullglob
versions=()
for candidate in "$model_dir"/*/saved_model.pb; do
  version="$(basename "$(dirname "$candidate")")"
  [[ "$version" =~ ^[0-9]+$ ]] && versions+=("$version")
done
if [[ ${#versions[@]} -eq 0 ]]; then
  fail "no SavedModel under $model_dir/<number>/ (mount the workdir's DIR/export as $model_dir)"
fi
# Why VERSION may not be served, or nothing when its files are what the export stage wrote.
refusal() {
  local dir="$model_dir/$1" link recorded actual
  [[ -f "$dir/fingerprint.json" ]] \
    || { echo "$dir has no fingerprint.json: not a version the export stage wrote"; return; }
  link="$(find "$dir" -type l -print -quit)"
  [[ -z "$link" ]] \
    || { echo "$dir holds a symbolic link ($link), which the export stage never writes"; return; }
  recorded="$(sed -n 's/^ *"content_sha256": *"\([0-9a-f]\{64\}\)".*/\1/p' "$dir/fingerprint.json")"
  [[ -n "$recorded" ]] \
    || { echo "$dir/fingerprint.json records no content_sha256: export the model again"; return; }
  actual="$(cd "$dir" && find . -type f ! -path ./fingerprint.json -print0 | LC_ALL=C sort -z \
            | xargs -0 sha256sum | sha256sum | cut -c1-64)"
  [[ "$actual" == "$recorded" ]] \
    || echo "$dir: its files differ from what the export stage recorded (fingerprint.json content_sha256)"
}
for version in "${versions[@]}"; do
  why="$(refusal "$version")"
  [[ -z "$why" ]] || fail "$why; refusing to serve it"
done

# The served version of serving.json (a line `"served_version": N,`), else the newest present.
served_version() {
  local named="" v
  if [[ -f "$state" ]]; then
    named="$(sed -n 's/^ *"served_version": *\([0-9][0-9]*\),\{0,1\} *$/\1/p' "$state" 2>/dev/null \
             | head -n 1 || true)"
  fi
  if [[ -n "$named" && -f "$model_dir/$named/saved_model.pb" ]]; then echo "$named"; return; fi
  for v in $(ls "$model_dir" 2>/dev/null | grep -E '^[0-9]+$' | sort -n); do
    [[ -f "$model_dir/$v/saved_model.pb" ]] && named="$v"
  done
  echo "$named"
}

# The model config naming the served version, replaced whole; a version that fails its check
# is not switched to (the config keeps the version being served).
render_config() {
  local version why
  version="$(served_version)"
  [[ -n "$version" ]] || return 0
  if [[ -f "$config" ]] && grep -q "versions: $version }" "$config"; then return 0; fi
  why="$(refusal "$version")"
  if [[ -n "$why" ]]; then echo "serving: not switching to version $version: $why" >&2; return 0; fi
  cat > "$config.tmp" <<EOF
model_config_list {
  config {
    name: "$MODEL_NAME"
    base_path: "$model_dir"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: $version } }
  }
}
EOF
  mv -f "$config.tmp" "$config"
}

[[ -z "${socket:-}" ]] || mkdir -p -m 0700 "$(dirname "$socket")"
# A private directory (random name, mode 0700) for the batching parameters.
private="$(mktemp -d)"
config="${SERVING_MODEL_CONFIG:-$private/models.config}"
render_config
server_pid=$$  # exec below keeps the pid: the watcher ends with the server
# The watcher checks every second that the server is still its parent (so it never outlives
# it holding the container's stderr, where its refusals go: an exited server not yet reaped
# still answers kill -0, but its children are reparented at once) and renders the config
# every $poll seconds.
server_lives() {
  local stat
  read -r -a stat < "/proc/$BASHPID/stat" 2>/dev/null || { kill -0 "$server_pid" 2>/dev/null; return; }
  [[ "${stat[3]}" == "$server_pid" ]]
}
( tick=0
  while sleep 1 && server_lives; do
    (( ++tick % poll )) || render_config
  done ) </dev/null >/dev/null &
cat >"$private/batching.pbtxt" <<PBTXT
max_batch_size { value: $max_batch }
batch_timeout_micros { value: $batch_timeout }
max_enqueued_batches { value: $max_enqueued }
num_batch_threads { value: $batch_threads }
PBTXT
echo "$note" >&2
exec tensorflow_model_server "${listen[@]}" \
  --model_config_file="$config" --model_config_file_poll_wait_seconds="$poll" \
  --enable_batching=true --batching_parameters_file="$private/batching.pbtxt" \
  --grpc_channel_arguments="grpc.max_receive_message_length=$max_request" \
  --rest_api_timeout_in_ms="$timeout_ms" --rest_api_num_threads="$rest_threads" "$@"
