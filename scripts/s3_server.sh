#!/bin/bash
# Start or stop a real S3 server on loopback for twophase's integration tests and benchmarks.
#
#   scripts/s3_server.sh start [DIR]     Ceph radosgw (mon + memstore OSD + rgw), no systemd, no Docker.
#                                        Installs radosgw ceph-mon ceph-osd from Debian packages if missing.
#   scripts/s3_server.sh stop  [DIR]     stop the daemons started from DIR (by their pid files) and remove DIR
#   scripts/s3_server.sh moto  [DIR]     moto's S3 server instead (fast; differs from S3 on aborted uploads)
#
# On success prints shell assignments (eval-able):
#   TWOPHASE_S3_ENDPOINT=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test ...
# Ports: free ones unless TWOPHASE_RGW_PORT / TWOPHASE_MON_PORT are set (moto: TWOPHASE_MOTO_PORT, 17482).
# A failed start names the step that failed, stops whatever it had started and is tried once more.
set -euo pipefail
CMD=${1:-start}
D=${2:-${TWOPHASE_S3_DIR:-/tmp/twophase-s3}}
MOTOP=${TWOPHASE_MOTO_PORT:-17482}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python3

log() { echo "s3_server: $*" >&2; }

install_ceph() {
  if command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null; then
    return
  fi
  log "installing radosgw ceph-mon ceph-osd (Debian packages)"
  local SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd >&2
}

wait_http() {
  for _ in $(seq 1 120); do
    curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
    sleep 0.5
  done
  return 1
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_rgw() {
  install_ceph
  if [ -f "$D/endpoint" ] && pid_alive "$D/run/client.rgw.x.pid" && curl -s -o /dev/null "$(cat "$D/endpoint")/"; then
    log "radosgw already running from $D"
    echo "TWOPHASE_S3_ENDPOINT=$(cat "$D/endpoint") AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 TWOPHASE_S3_KIND=radosgw"
    return
  fi
  stop_dir
  rm -rf "$D"; mkdir -p "$D"/{run,log,mon-a,osd-0,rgw}
  # free ports unless given: a leftover daemon of another run must never make this start fail
  local MON=${TWOPHASE_MON_PORT:-$(free_port)} RGW=${TWOPHASE_RGW_PORT:-$(free_port)}
  local FSID OU
  FSID=$("$PY" -c 'import uuid;print(uuid.uuid4())'); OU=$("$PY" -c 'import uuid;print(uuid.uuid4())')
  cat > "$D/ceph.conf" <<CONF
[global]
fsid = $FSID
mon_host = [v1:127.0.0.1:$MON]
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_bind_msgr2 = false
ms_bind_ipv6 = false
public_network = 127.0.0.0/8
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_allow_pool_size_one = true
mon_max_pg_per_osd = 2000
osd_crush_chooseleaf_type = 0
osd_class_update_on_start = false
osd_crush_update_on_start = false
run_dir = $D/run
admin_socket = $D/run/\$name.asok
log_file = $D/log/\$name.log
pid_file = $D/run/\$name.pid
mon_data = $D/mon-\$id
osd_data = $D/osd-\$id
osd_objectstore = memstore
memstore_device_bytes = 2147483648
mon_warn_on_pool_no_redundancy = false
[client.rgw.x]
rgw_frontends = beast endpoint=127.0.0.1:$RGW tcp_nodelay=1
rgw_data = $D/rgw
CONF
  local C="-c $D/ceph.conf" STEP=""
  fail() {
    log "start failed at: $STEP (mon port $MON, rgw port $RGW); daemons stopped; logs:"
    tail -n 5 "$D"/log/*.log >&2 2>/dev/null || true
    stop_dir
    exit 1
  }
  cd "$D"
  STEP="monmaptool";       monmaptool --create --addv a "[v1:127.0.0.1:$MON]" --fsid "$FSID" monmap >/dev/null || fail
  STEP="mon keyring";      ceph-authtool --create-keyring mon.keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null || fail
  STEP="ceph-mon --mkfs";  ceph-mon $C --mkfs -i a --monmap monmap --keyring mon.keyring >&2 || fail
  STEP="ceph-mon";         ceph-mon $C -i a >&2 || fail
  STEP="osd create";       timeout 60 ceph $C osd create "$OU" >/dev/null || fail
  STEP="ceph-osd --mkfs";  ceph-osd $C -i 0 --mkfs --osd-uuid "$OU" >/dev/null 2>&1 || fail
  STEP="crush map";        { timeout 60 ceph $C osd crush add-bucket localhost host && timeout 60 ceph $C osd crush move localhost root=default \
                             && timeout 60 ceph $C osd crush add osd.0 1.0 host=localhost; } >/dev/null 2>&1 || fail
  STEP="ceph-osd";         ceph-osd $C -i 0 >/dev/null 2>&1 || fail
  STEP="radosgw";          radosgw $C -n client.rgw.x >&2 || fail
  STEP="radosgw answers on port $RGW"; wait_http "$RGW" || fail
  STEP="radosgw-admin user create"; radosgw-admin $C -n client.rgw.x user create --uid=test --display-name=test \
    --access-key=test --secret=test >/dev/null 2>&1 || fail
  cd - >/dev/null
  echo "http://127.0.0.1:$RGW" > "$D/endpoint"
  echo "TWOPHASE_S3_ENDPOINT=http://127.0.0.1:$RGW AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 TWOPHASE_S3_KIND=radosgw"
}

start_moto() {
  mkdir -p "$D"
  if ! curl -s -o /dev/null "http://127.0.0.1:$MOTOP/"; then
    setsid "$PY" -m moto.server -H 127.0.0.1 -p "$MOTOP" >"$D/moto.log" 2>&1 < /dev/null &
    echo $! > "$D/moto.pid"
    wait_http "$MOTOP" || { log "moto server did not start; see $D/moto.log"; exit 1; }
  fi
  echo "TWOPHASE_S3_ENDPOINT=http://127.0.0.1:$MOTOP AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 TWOPHASE_S3_KIND=moto"
}

stop_dir() {
  [ -d "$D" ] || return 0
  local f pid
  for f in "$D"/run/*.pid "$D"/moto.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
  done
  sleep 1
  for f in "$D"/run/*.pid "$D"/moto.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -9 "$pid" 2>/dev/null || true
  done
  # daemons of this directory whose pid file never appeared (a start that failed half-way)
  pkill -9 -f -- "-c $D/ceph.conf" 2>/dev/null || true
}

case "$CMD" in
  # one more try on fresh ports: a start that failed (seen: a ceph command refused while the machine was
  # crowded with other runs' daemons) would otherwise fail every S3 test of a session. A subshell: fail() exits it.
  start) ( start_rgw ) || { log "radosgw did not start; trying once more on fresh ports"; ( start_rgw ); } ;;
  moto) start_moto ;;
  stop) stop_dir; rm -rf "$D" ;;
  install) install_ceph ;;
  *) echo "usage: $0 start|moto|stop|install [DIR]" >&2; exit 2 ;;
esac
