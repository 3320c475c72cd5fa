#!/usr/bin/env bash
# PostgreSQL (Debian's packages) in a private data directory, for twophase-postgres's tests and benchmark.
#   scripts/pg_server.sh fetch                    install the server (apt-get install postgresql) if initdb is missing
#   scripts/pg_server.sh start DIR [PORT]         initdb DIR/data (owned by an unprivileged user: postgres refuses
#                                                 root), start it on 127.0.0.1:PORT (default: a free port) with
#                                                 max_prepared_transactions set; prints env lines (eval-able):
#                                                 TWOPHASE_PG_URL=postgresql://twophase:twophase-pg-pw@127.0.0.1:PORT/postgres ...
#   scripts/pg_server.sh stop DIR                 stop it by its PID (DIR/data/postmaster.pid), fast shutdown
#   scripts/pg_server.sh fetch-jdbc               PostgreSQL's JDBC driver (mvn, scripts/jvm/postgres/pom.xml) into
#                                                 .venv/jvm/postgresql-jdbc-<version>/ (the benchmark's Spark JDBC
#                                                 baseline only); prints the jar's path
# TWOPHASE_PG_MAX_PREPARED (default 64) sets max_prepared_transactions (0: the server's own default, for tests
# of the sink's refusal). The superuser is "twophase" (password "twophase-pg-pw", scram-sha-256 over TCP); the
# user the server runs as is the "postgres" system user the package creates (created if missing) when this
# runs as root, else the current user.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3

log() { echo "pg_server: $*" >&2; }

bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ]; then
    pg_config --bindir; return
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  return 1
}

fetch() {
  if bindir >/dev/null; then return; fi
  log "installing postgresql (Debian packages)"
  local SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends postgresql >&2
  bindir >/dev/null || { log "initdb still missing after apt-get install postgresql"; exit 1; }
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run a command as the server's user
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null 2>&1; then runuser -u "$OWNER" -- "$@"; else su -s /bin/sh "$OWNER" -c "$(printf '%q ' "$@")"; fi
  else
    "$@"
  fi
}

start() {
  local dir="$1" port="${2:-}"
  [ -n "$port" ] || port=$(free_port)
  fetch
  local bin; bin=$(bindir)
  OWNER=$(id -un)
  if [ "$(id -u)" = 0 ]; then
    OWNER=postgres
    getent passwd postgres >/dev/null || useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
  fi
  if [ -f "$dir/data/postmaster.pid" ] && kill -0 "$(head -1 "$dir/data/postmaster.pid")" 2>/dev/null; then
    log "a server already runs from $dir: stop it first (scripts/pg_server.sh stop $dir)"; exit 1
  fi
  rm -rf "$dir/data"; mkdir -p "$dir"
  chmod 755 "$dir"                      # the server's user must reach DIR (pytest's tmp dirs are 0700)
  [ "$(id -u)" = 0 ] && chown "$OWNER" "$dir"
  local pw="$dir/.pw"; echo twophase-pg-pw > "$pw"; [ "$(id -u)" = 0 ] && chown "$OWNER" "$pw"
  as_owner "$bin/initdb" -D "$dir/data" -U twophase --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { log "initdb failed:"; tail -20 "$dir/initdb.log" >&2; exit 1; }
  rm -f "$pw"
  cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_prepared_transactions = ${TWOPHASE_PG_MAX_PREPARED:-64}
max_connections = 100
shared_buffers = 64MB
logging_collector = off
CONF
  if ! as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null 2>&1; then
    log "the server did not start on port $port:"; tail -20 "$dir/server.log" >&2; exit 1
  fi
  echo "127.0.0.1 $port" > "$dir/endpoint"
  echo "TWOPHASE_PG_URL=postgresql://twophase:twophase-pg-pw@127.0.0.1:$port/postgres TWOPHASE_PG_PORT=$port TWOPHASE_PG_DIR=$dir"
}

stop() {
  local dir="$1" pidfile="$1/data/postmaster.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(head -1 "$pidfile")
  kill -INT "$pid" 2>/dev/null || return 0  # fast shutdown: open transactions rolled back, prepared ones kept
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "postgres $pid did not stop in 10 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

fetch_jdbc() {
  local version="${PGJDBC_VERSION:-42.7.14}" dir="$ROOT/.venv/jvm/postgresql-jdbc-${PGJDBC_VERSION:-42.7.14}"
  if [ ! -f "$dir/.complete" ]; then
    command -v mvn >/dev/null || { log "Maven (mvn) is needed: apt-get install maven"; exit 1; }
    mkdir -p "$dir"
    mvn -q -B -f "$ROOT/scripts/jvm/postgres/pom.xml" dependency:copy-dependencies -Dpgjdbc.version="$version" \
        -DincludeScope=runtime -DoutputDirectory="$dir" >&2
    touch "$dir/.complete"
  fi
  ls "$dir"/postgresql-*.jar
}

case "${1:-}" in
  fetch) fetch ;;
  fetch-jdbc) fetch_jdbc ;;
  start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR [PORT]" >&2; exit 2; }; start "$2" "${3:-}" ;;
  stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 fetch | fetch-jdbc | start DIR [PORT] | stop DIR" >&2; exit 2 ;;
esac
