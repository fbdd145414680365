#!/usr/bin/env bash
# An MLflow tracking server for ladder runs: SQLite metadata, artifacts served by the server.
#   infra/mlflow/server.sh [DATA_DIR] [PORT] [HOST]
# Then: export MLFLOW_TRACKING_URI=http://HOST:PORT
# MLFLOW_SERVER_WORKERS sets the web workers (default 4, MLflow's own). MLflow's GenAI job runners
# (scorers, trace jobs) are off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true: ladder records
# training runs only, and the runners are a dozen more processes.
set -euo pipefail
DATA_DIR="$(mkdir -p "${1:-mlflow-server}" && cd "${1:-mlflow-server}" && pwd)"
PORT="${2:-5000}"
HOST="${3:-127.0.0.1}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec mlflow server \
  --backend-store-uri "sqlite:///${DATA_DIR}/mlflow.db" \
  --artifacts-destination "${DATA_DIR}/artifacts" \
  --serve-artifacts \
  --workers "${MLFLOW_SERVER_WORKERS:-4}" \
  --host "${HOST}" --port "${PORT}"
