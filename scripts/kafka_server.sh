#!/usr/bin/env bash
# Apache Kafka (KRaft, combined broker + controller) from Maven Central jars, for tests and manual runs.
#   scripts/kafka_server.sh fetch                 resolve the jars (mvn, scripts/jvm/kafka/pom.xml) into .venv/jvm/
#   scripts/kafka_server.sh start DIR [PORT] [KEY=VALUE...]
#                                                 format DIR's storage with Kafka's StorageTool, start kafka.Kafka on
#                                                 127.0.0.1:PORT (default: a free port) in the background; prints
#                                                 the bootstrap servers; broker settings are Kafka's defaults unless
#                                                 given as KEY=VALUE (e.g. transaction.max.timeout.ms=3600000)
#   scripts/kafka_server.sh stop DIR              stop it by its PID (DIR/kafka.pid)
#   scripts/kafka_server.sh cluster-id [N]        print N KRaft cluster ids (never starting with '-')
# KAFKA_VERSION picks the release (default below; 3.9.1 for the 3.x line). Nothing is downloaded by URL.
# KAFKA_EXTRA_LISTENERS (e.g. SASL_PLAINTEXT://127.0.0.1:9093) is appended to listeners= (the controller port is
# chosen here); give their advertised.listeners / listener.security.protocol.map as KEY=VALUE (the last line wins).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${KAFKA_VERSION:-4.4.0}"
JARS="$ROOT/.venv/jvm/kafka-$VERSION"

fetch() {
  if [ -f "$JARS/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "kafka_server: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mkdir -p "$JARS"
  mvn -q -B -f "$ROOT/scripts/jvm/kafka/pom.xml" dependency:copy-dependencies -Dkafka.version="$VERSION" \
      -DincludeScope=runtime -DoutputDirectory="$JARS" >&2
  touch "$JARS/.complete"
}

# A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, never starting with '-' (Kafka's own
# Uuid.randomUuid rule): `StorageTool format -t -xyz...` reads such an id as an option and prints its usage
# (1 in 64 ids; it failed a start of the secured broker once). `cluster-id [N]` prints N of them.
cluster_id() { "$ROOT/.venv/bin/python" -c '
import base64, sys, uuid
for _ in range(int(sys.argv[1])):
    c = "-"
    while c.startswith("-"):
        c = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    print(c)' "${1:-1}"; }

free_port() { "$ROOT/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
  local dir="$1"; shift
  local port="${1:-}"; if [ -n "$port" ] && [[ "$port" != *=* ]]; then shift; else port=$(free_port); fi
  fetch
  mkdir -p "$dir"
  local cport; cport=$(free_port)
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport${KAFKA_EXTRA_LISTENERS:+,$KAFKA_EXTRA_LISTENERS}
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  for kv in "$@"; do echo "$kv" >> "$dir/server.properties"; done
  cat > "$dir/log4j2.properties" <<'PROPS'
rootLogger.level=WARN
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
PROPS
  local java=(java -Xms256m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$JARS/*")
  if [ ! -f "$dir/data/meta.properties" ]; then
    local cid; cid=$(cluster_id)
    "${java[@]}" kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" > "$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; exit 1; }
  fi
  setsid "${java[@]}" kafka.Kafka "$dir/server.properties" > "$dir/server.log" 2>&1 < /dev/null &
  echo $! > "$dir/kafka.pid"
  echo "$port" > "$dir/port"
  for _ in $(seq 1 120); do
    if "$ROOT/.venv/bin/python" -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null; then
      echo "127.0.0.1:$port"; return
    fi
    kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || { tail -30 "$dir/server.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "kafka_server: no listener on $port after 60 s (log: $dir/server.log)" >&2; exit 1
}

stop() {
  local dir="$1"
  [ -f "$dir/kafka.pid" ] || return 0
  local pid; pid=$(cat "$dir/kafka.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || { rm -f "$dir/kafka.pid"; return 0; }; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/kafka.pid"
}

case "${1:-}" in
  fetch) fetch ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  cluster-id) shift; cluster_id "$@" ;;
  *) echo "usage: $0 fetch | start DIR [PORT] [KEY=VALUE...] | stop DIR | cluster-id [N]" >&2; exit 2 ;;
esac
