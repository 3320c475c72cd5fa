#!/bin/bash
# Start or stop a Spark standalone cluster on loopback for twophase's cluster tests (integration/cluster).
#
#   scripts/spark_cluster.sh start  [DIR]   a master and two workers (1 core, 2g each, own work dirs, worker I
#                                           on 127.0.0.I: two hosts to Spark),
#                                           every port free-picked; waits until both workers are ALIVE
#   scripts/spark_cluster.sh stop   [DIR]   SIGTERM exactly the PIDs recorded in DIR/cluster.env,
#                                           SIGKILL after 5 s
#   scripts/spark_cluster.sh status [DIR]   what is recorded and alive; exit 0 only if all of it is up
#   scripts/spark_cluster.sh heal   [DIR]   restart the workers that died (the nemesis kills whole workers),
#                                           same master, same settings; waits until all are ALIVE again
#
# DIR defaults to $TWOPHASE_SPARK_DIR or /tmp/twophase-spark-cluster. It holds cluster.env
# (SPARK_MASTER_URL=spark://127.0.0.1:P, SPARK_MASTER_WEBUI, MASTER_PID, WORKER1_PID, WORKER2_PID, ...),
# one log per daemon and the workers' work dirs. start prints cluster.env (eval-able). Both commands are
# idempotent: start on a running cluster only prints it; stop on a stopped one does nothing.
# The daemons run from the PySpark distribution (no sbin/ in the wheel): $SPARK_HOME/bin/spark-class.
# A failed start names the failed step and its log file, and stops whatever it had started.
set -euo pipefail
CMD=${1:-start}
D=${2:-${TWOPHASE_SPARK_DIR:-/tmp/twophase-spark-cluster}}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python3
WORKERS=2
MASTER_WAIT_S=${TWOPHASE_SPARK_MASTER_WAIT:-60}
WORKER_WAIT_S=${TWOPHASE_SPARK_WORKER_WAIT:-90}

log() { echo "spark_cluster: $*" >&2; }

spark_home() {
  if [ -n "${SPARK_HOME:-}" ] && [ -x "$SPARK_HOME/bin/spark-class" ]; then echo "$SPARK_HOME"; return; fi
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

env_get() { # env_get KEY -> value from DIR/cluster.env (empty if absent)
  [ -f "$D/cluster.env" ] || return 0
  sed -n "s/^$1=//p" "$D/cluster.env" | tail -1
}

# a PID is "ours" only if alive and still running the Spark class we started (never a recycled PID)
ours() { # ours PID CLASS
  [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q "$2"
}

master_json() { curl -sf --max-time 2 "http://127.0.0.1:$1/json/"; }

alive_workers() { # alive_workers WEBUI_PORT -> number of ALIVE workers the master lists (0 if it does not answer)
  { master_json "$1" 2>/dev/null || true; } | "$PY" -c '
import json, sys
try:
    print(sum(1 for w in json.load(sys.stdin).get("workers", []) if w.get("state") == "ALIVE"))
except ValueError:
    print(0)'
}

all_pids() { for k in MASTER_PID $(seq -f 'WORKER%g_PID' 1 $WORKERS); do env_get "$k"; done; }

running() { # the recorded cluster is fully up
  [ -f "$D/cluster.env" ] || return 1
  ours "$(env_get MASTER_PID)" deploy.master.Master || return 1
  for i in $(seq 1 $WORKERS); do ours "$(env_get "WORKER${i}_PID")" deploy.worker.Worker || return 1; done
  [ "$(alive_workers "$(env_get SPARK_MASTER_WEBUI_PORT)")" -ge $WORKERS ]
}

stop_dir() {
  local pids=() p
  for p in $(all_pids); do
    if ours "$p" 'org.apache.spark.deploy'; then pids+=("$p"); fi
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  log "stopping ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 50); do # 5 s
    local left=()
    for p in "${pids[@]}"; do if ours "$p" 'org.apache.spark.deploy'; then left+=("$p"); fi; done
    [ ${#left[@]} -gt 0 ] || return 0
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    if ours "$p" 'org.apache.spark.deploy'; then log "SIGKILL $p"; kill -KILL "$p" 2>/dev/null || true; fi
  done
}

fail() { # fail STEP LOGFILE
  log "FAILED: $1 (log: $2)"
  local f
  for f in $2; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  stop_dir
  exit 1
}

# Daemons: own session (setsid), so a fault that kills a session never reaches the caller; no inherited
# fault injection; loopback only. Executors inherit the worker's environment.
daemon_env() { # daemon_env SPARK_HOME -> the env(1) prefix of every daemon
  ENVV=(env -u TWOPHASE_FAULT -u TWOPHASE_FAULT_MARKER -u TWOPHASE_FAULT_SCOPE SPARK_HOME="$1"
        SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_HOSTNAME=127.0.0.1 SPARK_NO_DAEMONIZE=1)
}

# Worker I listens on 127.0.0.I: to Spark each worker is its own host, as on a real cluster (a speculative
# copy is never launched on the host of the attempt it races, so with one host there would be none).
start_worker() { # start_worker I SPARK_HOME MASTER_PORT
  local WW H="127.0.0.$1"
  WW=$(free_port)
  daemon_env "$2"
  mkdir -p "$D/worker$1"
  setsid "${ENVV[@]}" SPARK_LOCAL_IP="$H" SPARK_LOCAL_HOSTNAME="$H" SPARK_WORKER_DIR="$D/worker$1" \
    "$2/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    "spark://127.0.0.1:$3" --host "$H" --work-dir "$D/worker$1" --cores 1 --memory 2g --webui-port "$WW" \
    >>"$D/worker$1.log" 2>&1 </dev/null &
  echo "WORKER${1}_PID=$!" >>"$D/cluster.env"
  echo "WORKER${1}_DIR=$D/worker$1" >>"$D/cluster.env"
}

wait_workers() { # wait_workers MASTER_WEBUI_PORT: every worker process up and ALIVE at the master
  local ok="" i
  for _ in $(seq 1 $((WORKER_WAIT_S * 2))); do
    for i in $(seq 1 $WORKERS); do
      ours "$(env_get "WORKER${i}_PID")" deploy.worker.Worker || fail "worker $i exited while starting" "$D/worker$i.log"
    done
    if [ "$(alive_workers "$1")" -ge $WORKERS ]; then ok=1; break; fi
    sleep 0.5
  done
  [ -n "$ok" ] || fail "only $(alive_workers "$1") of $WORKERS workers registered within ${WORKER_WAIT_S}s" \
    "$D/worker1.log $D/worker2.log $D/master.log"
}

heal() {
  [ -f "$D/cluster.env" ] || { log "no cluster recorded in $D"; exit 1; }
  ours "$(env_get MASTER_PID)" deploy.master.Master || { log "FAILED: the master is gone; start a new cluster"; exit 1; }
  local SH MP i healed=""
  SH=$(env_get SPARK_HOME)
  MP=$(env_get SPARK_MASTER_URL); MP=${MP##*:}
  for i in $(seq 1 $WORKERS); do
    if ! ours "$(env_get "WORKER${i}_PID")" deploy.worker.Worker; then
      start_worker "$i" "$SH" "$MP"; healed="$healed $i"
    fi
  done
  wait_workers "$(env_get SPARK_MASTER_WEBUI_PORT)"
  log "healed:${healed:- nothing to do}"
}

start() {
  if running; then
    log "already running from $D"
    cat "$D/cluster.env"
    return
  fi
  stop_dir
  local SH MP MW
  SH=$(spark_home)
  [ -x "$SH/bin/spark-class" ] || { log "FAILED: no spark-class under SPARK_HOME=$SH"; exit 1; }
  rm -rf "$D"; mkdir -p "$D"
  MP=$(free_port); MW=$(free_port)
  daemon_env "$SH"
  {
    echo "SPARK_MASTER_URL=spark://127.0.0.1:$MP"
    echo "SPARK_MASTER_WEBUI=http://127.0.0.1:$MW"
    echo "SPARK_MASTER_WEBUI_PORT=$MW"
    echo "SPARK_HOME=$SH"
  } >"$D/cluster.env"
  setsid "${ENVV[@]}" "$SH/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$MP" --webui-port "$MW" >"$D/master.log" 2>&1 </dev/null &
  echo "MASTER_PID=$!" >>"$D/cluster.env"
  local ok=""
  for _ in $(seq 1 $((MASTER_WAIT_S * 2))); do
    ours "$(env_get MASTER_PID)" deploy.master.Master || fail "master exited while starting" "$D/master.log"
    if master_json "$MW" >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ -n "$ok" ] || fail "master did not answer on http://127.0.0.1:$MW/json/ within ${MASTER_WAIT_S}s" "$D/master.log"
  local i
  for i in $(seq 1 $WORKERS); do start_worker "$i" "$SH" "$MP"; done
  wait_workers "$MW"
  log "up: spark://127.0.0.1:$MP (web UI http://127.0.0.1:$MW), $WORKERS workers, logs in $D"
  cat "$D/cluster.env"
}

status() {
  if [ ! -f "$D/cluster.env" ]; then log "no cluster recorded in $D"; return 1; fi
  cat "$D/cluster.env"
  local k p
  for k in MASTER_PID $(seq -f 'WORKER%g_PID' 1 $WORKERS); do
    p=$(env_get "$k")
    if ours "$p" 'org.apache.spark.deploy'; then echo "$k $p alive"; else echo "$k $p dead"; fi
  done
  echo "alive workers (master's view): $(alive_workers "$(env_get SPARK_MASTER_WEBUI_PORT)")"
  running
}

case "$CMD" in
  start) start ;;
  stop) stop_dir; [ -f "$D/cluster.env" ] && log "stopped the cluster recorded in $D" || true ;;
  status) status ;;
  heal) heal ;;
  *) echo "usage: $0 start|stop|status|heal [DIR]" >&2; exit 2 ;;
esac
