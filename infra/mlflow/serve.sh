#!/usr/bin/env bash
# The shared MLflow tracking server for ladder, with authentication: MLflow's basic-auth app
# (users and passwords; runs, experiments and models readable or writable per user).
#
# Configured by the environment (in Kubernetes from Secrets, see infra/mlflow/k8s/):
#   MLFLOW_BACKEND_STORE_URI      run metadata, e.g. postgresql://mlflow:PASSWORD@postgres:5432/mlflow
#   MLFLOW_ARTIFACTS_DESTINATION  artifact store the server proxies, e.g. s3://BUCKET/mlflow
#   MLFLOW_AUTH_DATABASE_URI      users and permissions, e.g. postgresql://mlflow:PASSWORD@postgres:5432/mlflow_auth
#   MLFLOW_AUTH_ADMIN_USERNAME    the admin created on first start (MLflow itself reads these two;
#   MLFLOW_AUTH_ADMIN_PASSWORD    it ships no default password and refuses to start without one)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  signs the auth app's sessions and CSRF tokens
# Optional: MLFLOW_HOST (0.0.0.0), MLFLOW_PORT (5000), MLFLOW_WORKERS (4),
#   MLFLOW_ALLOWED_HOSTS (Host headers accepted, e.g. "mlflow.ladder.svc.cluster.local:*,localhost:*"),
#   MLFLOW_DEFAULT_PERMISSION (what a signed-in user may do with others' experiments: READ),
#   MLFLOW_AUTH_CACHE_TTL_SECONDS (60): how long a checked password is remembered. Every request
#   is authenticated and each check is a deliberately slow hash; training runs send many small
#   requests, so the default caches checks for a minute (a changed password may then still be
#   accepted for up to that long by a server worker that had cached it; 0 turns the cache off).
# Clients authenticate with MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.
set -euo pipefail
for name in MLFLOW_BACKEND_STORE_URI MLFLOW_ARTIFACTS_DESTINATION MLFLOW_AUTH_DATABASE_URI \
            MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY; do
  if [ -z "${!name:-}" ]; then
    echo "serve.sh: set ${name} (see the header of infra/mlflow/serve.sh)" >&2
    exit 2
  fi
done
# The auth app reads its settings from an ini file; its database URI holds a password, so the
# file is written here, readable by this user only, instead of being shipped in a ConfigMap.
conf_dir="$(mktemp -d)"
umask 077
cat > "${conf_dir}/basic_auth.ini" <<INI
[mlflow]
default_permission = ${MLFLOW_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${MLFLOW_AUTH_CACHE_TTL_SECONDS:-60}
INI
export MLFLOW_AUTH_CONFIG_PATH="${conf_dir}/basic_auth.ini"
args=(--app-name basic-auth
      --backend-store-uri "${MLFLOW_BACKEND_STORE_URI}"
      --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION}"
      --serve-artifacts
      --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}"
      --workers "${MLFLOW_WORKERS:-4}")
if [ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]; then
  args+=(--allowed-hosts "${MLFLOW_ALLOWED_HOSTS}")
fi
exec mlflow server "${args[@]}"
