#!/usr/bin/env bash
# An MLflow tracking server for ladder runs: SQLite metadata, artifacts served by the server.
#   infra/mlflow/server.sh [DATA_DIR] [PORT] [HOST]
# Then: export MLFLOW_TRACKING_URI=http://HOST:PORT
set -euo pipefail
DATA_DIR="$(mkdir -p "${1:-mlflow-server}" && cd "${1:-mlflow-server}" && pwd)"
PORT="${2:-5000}"
HOST="${3:-127.0.0.1}"
exec mlflow server \
  --backend-store-uri "sqlite:///${DATA_DIR}/mlflow.db" \
  --artifacts-destination "${DATA_DIR}/artifacts" \
  --serve-artifacts \
  --host "${HOST}" --port "${PORT}"
