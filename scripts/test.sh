#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: fast tests (tests/) and the integration tests
# (integration/) against real Spark and the servers the fixtures start themselves (a Kafka broker
# from Apache Kafka, an S3 server). Extra arguments go to pytest (e.g. -k crash, -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
rc=0
.venv/bin/python -m pytest tests integration -p no:cacheprovider -rs --durations=30 "$@" || rc=$?
# Delta Lake's own engine as the oracle of twophase-delta (integration/delta_spark) runs in .venv-delta
# (scripts/setup_delta.sh: PySpark 4.2 + delta-spark 4.4); with no arguments, or TWOPHASE_DELTA_SPARK=1
if [ $# -eq 0 ] || [ "${TWOPHASE_DELTA_SPARK:-}" = 1 ]; then
  drc=0
  PYSPARK_PYTHON="$(pwd)/.venv-delta/bin/python" .venv-delta/bin/python -m pytest integration/delta_spark \
      -p no:cacheprovider -rs --durations=10 || drc=$?
  [ "$rc" != 0 ] || rc=$drc
fi
exit "$rc"
