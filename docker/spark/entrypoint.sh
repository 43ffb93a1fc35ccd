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
    # The RPC endpoint binds to the pod's address (set explicitly), the web UI follows
    # SPARK_LOCAL_IP: loopback, reached with kubectl port-forward (docs/cluster.md §2.2). The
    # job itself turns on authentication and RPC encryption (spark_jobs/session.py).
    export SPARK_LOCAL_IP=127.0.0.1
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
    # The driver's executor startup settings (authentication, RPC encryption, its SASL
    # fallback) arrive as SPARK_JAVA_OPT_0, _1, ... (Spark's executor pod contract): each is
    # one JVM option, kept whole, in order.
    java_opts=()
    while IFS= read -r name; do
      java_opts+=("${!name}")
    done < <(compgen -v SPARK_JAVA_OPT_ | sed -n 's/^SPARK_JAVA_OPT_\([0-9][0-9]*\)$/\1/p' | sort -n \
             | sed 's/^/SPARK_JAVA_OPT_/')
    exec java ${java_opts[@]+"${java_opts[@]}"} ${SPARK_EXECUTOR_JAVA_OPTS:-} -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
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
