#!/usr/bin/env bash
# Entrypoint of the preprocessing images.
#   driver|executor ARGS  Spark on Kubernetes starts its pods with these (the same contract as
#                         Apache Spark's own image entrypoint), so this image can be
#                         spark.kubernetes.container.image.
#   master|worker ARGS    a standalone master or worker in the foreground, prepared as
#                         start-cluster.sh prepares its daemons (python -m pipeline.cluster_auth:
#                         authenticated off loopback with a mounted --secret-file, --insecure to
#                         opt out loudly, web UIs on loopback, never as root; docs/cluster.md).
#   anything else         the preprocess command: python -m spark_jobs ARGS.
set -euo pipefail
: "${SPARK_HOME:=/opt/spark}"
CLASSPATH_ALL="${SPARK_CLASSPATH:-}:$SPARK_HOME/jars/*"
case "${1:-}" in
  driver)
    shift
    [[ -n "${SPARK_DRIVER_BIND_ADDRESS:-}" ]] || {
      echo "entrypoint.sh: SPARK_DRIVER_BIND_ADDRESS is not set: the driver mode is for pods Spark on Kubernetes starts" >&2; exit 2; }
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@" ;;
  executor)
    shift
    for var in SPARK_EXECUTOR_MEMORY SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES \
               SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP; do
      [[ -n "${!var:-}" ]] || { echo "entrypoint.sh: $var is not set: the executor mode is for pods Spark on Kubernetes starts" >&2; exit 2; }
    done
    exec java ${SPARK_EXECUTOR_JAVA_OPTS:-} -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "$CLASSPATH_ALL" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}" "$@" ;;
  master|worker)
    export SPARK_HOME
    exec python -m pipeline.cluster_auth "$@" ;;
  *)
    exec python -m spark_jobs "$@" ;;
esac
