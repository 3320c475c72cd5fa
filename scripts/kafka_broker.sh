#!/usr/bin/env bash
# Start a local Kafka broker (noida-db, from the venv) in the foreground for manual runs of twophase-kafka:
#   scripts/kafka_broker.sh [port] [data-dir]      -> bootstrap servers 127.0.0.1:<port>
# It runs the server binary directly (the console script is a wrapper whose PID is not the server's).
# The broker never expires abandoned transactions; stop it with Ctrl-C.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
port="${1:-9092}"
data="${2:-${TMPDIR:-/tmp}/twophase-kafka-broker}"
bin="$("$here/.venv/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))')"
echo "kafka.bootstrap.servers=127.0.0.1:${port} (data in ${data})" >&2
exec "$bin" start --data-dir "$data" --only kafka --kafka-port "$port"
