#!/usr/bin/env bash
# A 3-broker Apache Kafka cluster (KRaft; every node a combined broker + controller, a 3-voter quorum) for the
# tests and the nemesis that need a transaction coordinator or a partition leader to move (issue 22).
# Replication factor 3, min.insync.replicas=2, the transaction state log and the offsets topic replicated
# (factor 3, min ISR 2). Same jars as scripts/kafka_server.sh (its `fetch`), each broker on free ports.
#   scripts/kafka_cluster.sh start DIR [N]       format and start N brokers (default 3) under DIR/b<i>; prints the
#                                                bootstrap servers (every broker); waits until all listen
#   scripts/kafka_cluster.sh stop DIR            stop every broker by PID (SIGCONT first, SIGTERM, then SIGKILL)
#   scripts/kafka_cluster.sh kill DIR BROKER     SIGKILL broker BROKER (its node id, 1..N)
#   scripts/kafka_cluster.sh restart DIR BROKER  start a killed broker again (same storage, same ports)
#   scripts/kafka_cluster.sh pause DIR BROKER    SIGSTOP it;   resume DIR BROKER: SIGCONT it
#   scripts/kafka_cluster.sh pids DIR            "<node id> <pid> <port>" per broker
# KAFKA_VERSION as in kafka_server.sh; KAFKA_CLUSTER_HEAP (default 384m) is each broker's -Xmx.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${KAFKA_VERSION:-4.4.0}"
JARS="$ROOT/.venv/jvm/kafka-$VERSION"
HEAP="${KAFKA_CLUSTER_HEAP:-384m}"
PY="$ROOT/.venv/bin/python"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
java_cmd() { JAVA=(java -Xms128m -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  -Dlog4j2.configurationFile="$1/log4j2.properties" -cp "$JARS/*"); }

launch() {  # launch DIR NODE: start node NODE's JVM in the background (storage already formatted)
  local b="$1/b$2"
  java_cmd "$b"
  setsid "${JAVA[@]}" kafka.Kafka "$b/server.properties" >> "$b/server.log" 2>&1 < /dev/null &
  echo $! > "$b/kafka.pid"
}

wait_listen() {  # wait_listen DIR NODE
  local b="$1/b$2" port; port=$(cat "$1/b$2/port")
  for _ in $(seq 1 240); do
    if "$PY" -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null; then return 0; fi
    kill -0 "$(cat "$b/kafka.pid")" 2>/dev/null || { tail -30 "$b/server.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "kafka_cluster: broker $2 not listening on $port after 120 s (log: $b/server.log)" >&2; exit 1
}

start() {
  local dir="$1" n="${2:-3}"
  bash "$ROOT/scripts/kafka_server.sh" fetch
  mkdir -p "$dir"
  local voters="" i
  for i in $(seq 1 "$n"); do
    mkdir -p "$dir/b$i"
    free_port > "$dir/b$i/port"; free_port > "$dir/b$i/cport"
    voters+="${voters:+,}$i@127.0.0.1:$(cat "$dir/b$i/cport")"
  done
  local rf=$(( n < 3 ? n : 3 )) isr=$(( n < 3 ? 1 : 2 ))
  local cid; cid=$(bash "$ROOT/scripts/kafka_server.sh" cluster-id)  # never starting with '-' (see there)
  for i in $(seq 1 "$n"); do
    local b="$dir/b$i" port cport; port=$(cat "$dir/b$i/port"); cport=$(cat "$dir/b$i/cport")
    cat > "$b/server.properties" <<PROPS
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$b/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=10
offsets.topic.num.partitions=10
group.initial.rebalance.delay.ms=0
unclean.leader.election.enable=false
replica.lag.time.max.ms=10000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
PROPS
    cat > "$b/log4j2.properties" <<'PROPS'
rootLogger.level=WARN
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
PROPS
    java_cmd "$b"
    "${JAVA[@]}" kafka.tools.StorageTool format -t "$cid" -c "$b/server.properties" > "$b/format.log" 2>&1 \
      || { cat "$b/format.log" >&2; exit 1; }
  done
  for i in $(seq 1 "$n"); do launch "$dir" "$i"; done
  for i in $(seq 1 "$n"); do wait_listen "$dir" "$i"; done
  local boot=""
  for i in $(seq 1 "$n"); do boot+="${boot:+,}127.0.0.1:$(cat "$dir/b$i/port")"; done
  echo "$boot" > "$dir/bootstrap"
  echo "$boot"
}

pid_of() { cat "$1/b$2/kafka.pid"; }

stop() {
  local dir="$1" b pid
  for b in "$dir"/b*/; do
    [ -f "$b/kafka.pid" ] || continue
    pid=$(cat "$b/kafka.pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
  for b in "$dir"/b*/; do
    [ -f "$b/kafka.pid" ] || continue
    pid=$(cat "$b/kafka.pid")
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$b/kafka.pid"
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop "$2" ;;
  kill) kill -9 "$(pid_of "$2" "$3")"; for _ in $(seq 1 40); do kill -0 "$(pid_of "$2" "$3")" 2>/dev/null || break; sleep 0.1; done ;;
  restart) launch "$2" "$3"; wait_listen "$2" "$3" ;;
  pause) kill -STOP "$(pid_of "$2" "$3")" ;;
  resume) kill -CONT "$(pid_of "$2" "$3")" ;;
  pids) for b in "$2"/b*/; do i=${b%/}; i=${i##*/b}; echo "$i $(cat "$b/kafka.pid" 2>/dev/null || echo -) $(cat "$b/port")"; done ;;
  *) echo "usage: $0 start DIR [N] | stop DIR | kill DIR BROKER | restart DIR BROKER | pause DIR BROKER | resume DIR BROKER | pids DIR" >&2; exit 2 ;;
esac
