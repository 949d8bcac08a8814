#!/usr/bin/env bash
# A PostgreSQL server for the shared-storage tests (tests/storage/test_postgres.py).
# Installs Debian's postgresql when missing, starts a private cluster listening on 127.0.0.1 only,
# creates a role and a database, and prints the SQLAlchemy URL on stdout (everything else on stderr):
#   export AUTOTUNE_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)"
# Idempotent: a running cluster is reused. Run as root (CI and developer machines are root).
set -euo pipefail
PORT="${AUTOTUNE_PG_PORT:-54329}"
DATA="${AUTOTUNE_PG_DIR:-/var/lib/postgresql/autotune-ci}"
DB=autotune_test
ROLE=autotune
PASSWORD=autotune  # a throwaway cluster that only listens on 127.0.0.1

log() { echo "postgres.sh: $*" >&2; }

if ! ls -d /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  log "installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
fi
BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
as_pg() { runuser -u postgres -- "$@"; }

if [ ! -s "$DATA/PG_VERSION" ]; then
  log "initdb $DATA"
  mkdir -p "$DATA"
  chown postgres:postgres "$DATA"
  chmod 700 "$DATA"
  # local socket: the postgres OS user only (peer); TCP on 127.0.0.1: password (scram)
  as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 -E UTF8 >&2
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  log "starting on 127.0.0.1:$PORT"
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DATA -c max_connections=200" \
    start >&2
fi

psql_su() { as_pg "$BIN/psql" -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [ "$(psql_su -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != "1" ]; then
  psql_su -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" >&2
fi
if [ "$(psql_su -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
  psql_su -c "CREATE DATABASE $DB OWNER $ROLE" >&2
fi
echo "postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
