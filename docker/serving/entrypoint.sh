#!/usr/bin/env bash
# TensorFlow Serving for the exported DLRM: checks the mounted model first, so a missing or
# misplaced export is one clear line (exit 2), not a server waiting forever for a version.
#   MODEL_NAME (dlrm), MODEL_BASE_PATH (/models): the model is $MODEL_BASE_PATH/$MODEL_NAME/<N>/
# with N a number: the workdir's DIR/export (one version directory per export) mounted as
# /models/dlrm. The server loads the newest version and, polling the directory, each newer one
# the export stage adds, without a restart. Extra arguments go to tensorflow_model_server.
set -euo pipefail
MODEL_NAME="${MODEL_NAME:-dlrm}"
MODEL_BASE_PATH="${MODEL_BASE_PATH:-/models}"
model_dir="$MODEL_BASE_PATH/$MODEL_NAME"
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
exec tensorflow_model_server --port=8500 --rest_api_port=8501 \
  --model_name="$MODEL_NAME" --model_base_path="$model_dir" "$@"
