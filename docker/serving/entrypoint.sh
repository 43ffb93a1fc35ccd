#!/usr/bin/env bash
# TensorFlow Serving for the exported DLRM: checks the mounted model first, so a missing or
# misplaced export is one clear line (exit 2), not a server waiting forever for a version.
#   MODEL_NAME (dlrm), MODEL_BASE_PATH (/models): the model is $MODEL_BASE_PATH/$MODEL_NAME/<N>/
# with N a number: the workdir's DIR/export (one version directory per export) mounted as
# /models/dlrm. Extra arguments go to tensorflow_model_server.
#
# Which version is served: the one DIR/export/serving.json names as "served_version" (the
# version a rollback holds, else the newest verified one; `run_pipeline.sh export ...`,
# docs/pipeline.md). The server gets a model config file naming that version, written here
# and rewritten whenever serving.json changes; it reads it again every
# SERVING_POLL_SECONDS (30), so a rollback or a new export is followed without a restart.
# Without serving.json (an export made before it existed) the newest version is served.
set -euo pipefail
MODEL_NAME="${MODEL_NAME:-dlrm}"
MODEL_BASE_PATH="${MODEL_BASE_PATH:-/models}"
POLL="${SERVING_POLL_SECONDS:-30}"
CONFIG="${SERVING_MODEL_CONFIG:-/tmp/$MODEL_NAME.models.config}"
model_dir="$MODEL_BASE_PATH/$MODEL_NAME"
state="$model_dir/serving.json"
shopt -s nullglob
versions=()
for candidate in "$model_dir"/*/saved_model.pb; do
  version="$(basename "$(dirname "$candidate")")"
  [[ "$version" =~ ^[0-9]+$ ]] && versions+=("$version")
done
if [[ ${#versions[@]} -eq 0 ]]; then
  echo "serving: no SavedModel under $model_dir/<number>/ (mount the workdir's DIR/export as $model_dir)" >&2
  exit 2
fi
if ! [[ "$POLL" =~ ^[1-9][0-9]*$ ]]; then
  echo "serving: SERVING_POLL_SECONDS must be a whole number of seconds, not '$POLL'" >&2
  exit 2
fi

# The served version of serving.json (a line `"served_version": N,`), or nothing.
served_version() {
  [[ -f "$state" ]] || return 0
  sed -n 's/^ *"served_version": *\([0-9][0-9]*\),\{0,1\} *$/\1/p' "$state" 2>/dev/null \
    | head -n 1 || true
}

# The model config for the served version (the newest when none is named), replaced whole.
render_config() {
  local version policy
  version="$(served_version)"
  if [[ -n "$version" && -f "$model_dir/$version/saved_model.pb" ]]; then
    policy="specific { versions: $version }"
  else
    policy="latest { num_versions: 1 }"
  fi
  cat > "$CONFIG.tmp" <<EOF
model_config_list {
  config {
    name: "$MODEL_NAME"
    base_path: "$model_dir"
    model_platform: "tensorflow"
    model_version_policy { $policy }
  }
}
EOF
  if ! cmp -s "$CONFIG.tmp" "$CONFIG"; then
    mv -f "$CONFIG.tmp" "$CONFIG"
  else
    rm -f "$CONFIG.tmp"
  fi
}

render_config
server_pid=$$  # exec below keeps the pid: the watcher ends with the server
( while sleep "$POLL" && kill -0 "$server_pid" 2>/dev/null; do render_config; done ) \
  </dev/null >/dev/null 2>&1 &
exec tensorflow_model_server --port=8500 --rest_api_port=8501 \
  --model_config_file="$CONFIG" --model_config_file_poll_wait_seconds="$POLL" "$@"
