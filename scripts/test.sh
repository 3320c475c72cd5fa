#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: fast tests (tests/) and the integration tests
# (integration/) against real Spark and the servers the fixtures start themselves (a Kafka broker
# from Apache Kafka, an S3 server). Extra arguments go to pytest (e.g. -k crash, -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
exec .venv/bin/python -m pytest tests integration -p no:cacheprovider -rs --durations=30 "$@"
