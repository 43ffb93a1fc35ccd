#!/usr/bin/env bash
# Image build step shared by Dockerfile.preprocess and Dockerfile.preprocess-gpu.
#   install_preprocess.sh deps     venv + docker/requirements/preprocess.lock (hash-checked)
#   install_preprocess.sh project  the project itself (editable, no dependency resolution) + checks
# Run from the project root inside the image; every version comes from pyproject.toml via pins.py.
set -euo pipefail
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

case "${1:-}" in
  deps)
    "$PY" -m venv "$VENV"
    # Preprocessing never imports TensorFlow or Horovod (docs/architecture.md), so they stay
    # out. Every package (and the project's build requirements) comes from the lock, which pip
    # checks file by file (--require-hashes); the lock must hold pyproject.toml's pins.
    "$VENV/bin/python" docker/pins.py check-lock docker/requirements/preprocess.in \
      docker/requirements/preprocess.lock
    "$VENV/bin/pip" install --no-cache-dir --disable-pip-version-check -q --require-hashes \
      --no-deps -r docker/requirements/preprocess.lock
    "$VENV/bin/python" docker/pins.py check-installed pyspark pyarrow numpy pandas numba pyyaml
    ;;
  project)
    # No build isolation: setuptools and wheel came from the lock, nothing is fetched here.
    "$VENV/bin/pip" install --no-cache-dir --disable-pip-version-check -q --no-deps \
      --no-build-isolation -e "$ROOT"
    # SPARK_HOME for spark-submit, spark-class and the cluster scripts: the pip PySpark's own tree.
    spark_home="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
    ln -sfn "$spark_home" /opt/spark
    mkdir -p /opt/spark/examples/src/main/scripts
    install -m 0755 docker/spark/getGpusResources.sh /opt/spark/examples/src/main/scripts/getGpusResources.sh
    "$VENV/bin/python" -m spark_jobs --help >/dev/null
    # The driver JVM's class-data archive (docs/spark_jobs.md): jobs start without it if not.
    "$VENV/bin/python" -m spark_jobs.build_archive >/dev/null ||
      echo "install_preprocess.sh: WARNING: no Spark class-data archive: jobs start without it" >&2
    ;;
  *)
    echo "usage: $0 deps|project" >&2
    exit 2
    ;;
esac
