#!/bin/sh
# fp8lab's MLflow tracking server: `mlflow server --app-name basic-auth` with its auth config written
# from the environment at start, so no password sits in the image, a ConfigMap or a command line.
#   MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://mlflow:PW@postgres:5432/mlflow \
#   MLFLOW_AUTH_DATABASE_URI=postgresql+psycopg://mlflow:PW@postgres:5432/mlflow_auth \
#   MLFLOW_AUTH_ADMIN_PASSWORD=... MLFLOW_FLASK_SERVER_SECRET_KEY=... \
#   entrypoint.sh --artifacts-destination s3://mlflow-artifacts --host 0.0.0.0 --port 5000
# MLFLOW_AUTH_CACHE_TTL_SECONDS (default 60; 0 turns it off): how long a worker trusts a verified
# username/password before it runs the PBKDF2 check again. Off, every request pays that check
# (tens of ms of CPU), and trials logging metrics make many requests. A changed password or
# removed user can be accepted by the other workers until the TTL ends.
# Also used as is by tests/integration/test_multinode.py (outside a container).
set -eu

: "${MLFLOW_BACKEND_STORE_URI:?set MLFLOW_BACKEND_STORE_URI (postgresql+psycopg://USER:PASSWORD@HOST:5432/mlflow)}"
: "${MLFLOW_AUTH_DATABASE_URI:?set MLFLOW_AUTH_DATABASE_URI (a database of its own, e.g. .../mlflow_auth)}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?set MLFLOW_AUTH_ADMIN_PASSWORD (the admin user is created with it on first start)}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (CSRF key; the same on every replica)}"

config_dir="${MLFLOW_AUTH_CONFIG_DIR:-${TMPDIR:-/tmp}}"
umask 077
cat > "$config_dir/basic_auth.ini" <<INI
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${MLFLOW_AUTH_CACHE_TTL_SECONDS:-60}
INI
export MLFLOW_AUTH_CONFIG_PATH="$config_dir/basic_auth.ini"

# The store URI comes from MLFLOW_BACKEND_STORE_URI (mlflow reads it); artifacts are proxied.
exec mlflow server --app-name basic-auth --serve-artifacts \
  --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-s3://mlflow-artifacts}" "$@"
