#!/bin/bash
# Start or stop Azurite (Microsoft's Azure Storage emulator, blob service only) on loopback for twophase's
# Azure integration tests: a real server speaking the Blob REST API (block blobs, staged blocks, ETags,
# conditional requests), no Docker.
#
#   scripts/azurite.sh start [DIR]     install azurite (TWOPHASE_AZURITE_VERSION, default 3.37.0) from npm into
#                                      the cache if missing, start the blob service on a free loopback port
#                                      with its data in DIR
#   scripts/azurite.sh stop  [DIR]     stop the server started from DIR (by its pid file) and remove DIR
#   scripts/azurite.sh install         only install (npm install --prefix $TWOPHASE_AZURITE_HOME azurite@VERSION)
#
# Why 3.37.0 and not "azurite@3": delta-rs (object_store) lists _delta_log with List Blobs' startFrom
# parameter; Azurite before 3.36 ignores it and answers every entry from the first, and delta-rs then
# fails the table's second commit ("Invalid table version"). npm resolves azurite@3 to 3.35.0 under
# node 20 (3.36+ declare node >= 22); 3.37.0 runs on node 20 here (tested with node v20.20).
#
# Needs node and npm (Debian: apt-get install nodejs npm). The install is cached in $TWOPHASE_AZURITE_HOME
# (default $HOME/.cache/twophase-azurite). Port: a free one unless TWOPHASE_AZURITE_PORT is set.
#
# On success prints shell assignments (eval-able), with Azurite's published development account:
#   TWOPHASE_AZURE_ENDPOINT=http://127.0.0.1:PORT/devstoreaccount1 AZURE_STORAGE_ACCOUNT_NAME=devstoreaccount1
#   AZURE_STORAGE_ACCOUNT_KEY=... TWOPHASE_AZURE_KIND=azurite
set -euo pipefail
CMD=${1:-start}
D=${2:-${TWOPHASE_AZURITE_DIR:-/tmp/twophase-azurite}}
CACHE=${TWOPHASE_AZURITE_HOME:-$HOME/.cache/twophase-azurite}
VERSION=${TWOPHASE_AZURITE_VERSION:-3.37.0}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python3
ACCOUNT=devstoreaccount1
# Azurite's well-known development key (published in its README; not a secret)
KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

log() { echo "azurite: $*" >&2; }

installed_version() {
  sed -n 's/^  "version": "\(.*\)",$/\1/p' "$CACHE/node_modules/azurite/package.json" 2>/dev/null | head -1
}

install_azurite() {
  if [ -x "$CACHE/node_modules/.bin/azurite-blob" ] && [ "$(installed_version)" = "$VERSION" ]; then
    return
  fi
  command -v node >/dev/null || { log "node is missing (apt-get install nodejs)"; exit 3; }
  command -v npm >/dev/null || { log "npm is missing (apt-get install npm)"; exit 3; }
  log "installing azurite@$VERSION into $CACHE (npm)"
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error --engine-strict=false "azurite@$VERSION" >&2
  [ "$(installed_version)" = "$VERSION" ] || { log "npm installed azurite $(installed_version), not $VERSION"; exit 1; }
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

answers() { curl -s -o /dev/null "$1/?comp=list" 2>/dev/null; }

assignments() {
  echo "TWOPHASE_AZURE_ENDPOINT=$1 AZURE_STORAGE_ACCOUNT_NAME=$ACCOUNT AZURE_STORAGE_ACCOUNT_KEY=$KEY TWOPHASE_AZURE_KIND=azurite"
}

start() {
  install_azurite
  if [ -f "$D/endpoint" ] && pid_alive "$D/azurite.pid" && answers "$(cat "$D/endpoint")"; then
    log "already running from $D"
    assignments "$(cat "$D/endpoint")"
    return
  fi
  stop_dir
  rm -rf "$D"; mkdir -p "$D/data"
  local PORT=${TWOPHASE_AZURITE_PORT:-$(free_port)}
  # --loose: accept headers Azurite does not implement; --skipApiVersionCheck: newer SDKs' x-ms-version;
  # --disableTelemetry: no calls home (this machine reaches no such host; the tries only fill the log)
  setsid "$CACHE/node_modules/.bin/azurite-blob" --blobHost 127.0.0.1 --blobPort "$PORT" --location "$D/data" \
    --loose --skipApiVersionCheck --disableProductStyleUrl --disableTelemetry --silent >"$D/azurite.log" 2>&1 < /dev/null &
  echo $! > "$D/azurite.pid"
  local url="http://127.0.0.1:$PORT/$ACCOUNT"
  for _ in $(seq 1 120); do
    if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then
      echo "$url" > "$D/endpoint"
      assignments "$url"
      return
    fi
    pid_alive "$D/azurite.pid" || break
    sleep 0.25
  done
  log "azurite did not start on port $PORT; log:"
  tail -n 20 "$D/azurite.log" >&2 || true
  stop_dir
  exit 1
}

stop_dir() {
  [ -f "$D/azurite.pid" ] || return 0
  local pid
  pid=$(cat "$D/azurite.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

case "$CMD" in
  start) start ;;
  stop) stop_dir; rm -rf "$D" ;;
  install) install_azurite ;;
  *) echo "usage: $0 start|stop|install [DIR]" >&2; exit 2 ;;
esac
