#!/usr/bin/env bash
# Set up (if needed) and run the demo: a Spark streaming job into the exactly-once file sink,
# SIGKILLed mid-run, restarted, then checked record by record. Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
exec .venv/bin/python scripts/demo.py "$@"
