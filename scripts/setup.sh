#!/usr/bin/env bash
# Set up everything twophase needs on a fresh machine (Debian/Ubuntu, Python 3.10+, root or sudo):
# Java 17 for Spark (installed with apt-get if missing), and the project's own virtual environment
# .venv with twophase and all extras installed in editable mode. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

apt_install() {
  local SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java 17 (Spark needs it)"
  apt_install openjdk-17-jre-headless
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
STAMP=.venv/.twophase-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "setup: installing twophase[all] into .venv (first time: a few minutes, PySpark is large)"
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -e ".[all]"; } \
        > .venv/setup.log 2>&1; then
    tail -40 .venv/setup.log; echo "setup: pip install failed (full log: .venv/setup.log)"; exit 1
  fi
  .venv/bin/python -c "import twophase, pyspark, pyarrow, kafka, deltalake, boto3, azure.storage.blob, pytest"
  touch "$STAMP"
fi
# PySpark discovers pyspark_* modules with pkgutil.iter_modules, which does not see an editable install's
# finder: put spark_discovery/ on the venv's path (a wheel installs the modules at top level)
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$ROOT/spark_discovery" > "$SITE/twophase-spark-discovery.pth"
# Apache Kafka's broker jars (Maven Central, through mvn and scripts/jvm/kafka/pom.xml) into .venv/jvm/
if ! command -v mvn >/dev/null 2>&1; then
  echo "setup: installing Maven (Apache Kafka's jars come through it)"
  apt_install maven
fi
bash scripts/kafka_server.sh fetch
KAFKA_VERSION=3.9.1 bash scripts/kafka_server.sh fetch   # the 3.x line (integration.kafka.apache_kafka.KAFKA_3)
bash scripts/spark_kafka.sh fetch   # Spark's own Kafka connector (peer tests, bench/bench_kafka.py)
bash scripts/hadoop_aws.sh fetch   # hadoop-aws (S3A) at PySpark's Hadoop + 2 AWS SDK modules, ~13 MB: integration/s3/test_s3a_reader.py
bash scripts/s3a_committer.sh build   # twophase's S3A committer jar (scripts/jvm/s3a-committer): the experimental native path on s3a://
bash scripts/pg_server.sh fetch   # PostgreSQL (apt-get install postgresql if initdb is missing), twophase-postgres tests
bash scripts/setup_delta.sh     # .venv-delta: PySpark 4.2 + delta-spark 4.4, Delta's jars, hadoop-aws and hadoop-azure, for integration/delta_spark (Delta as oracle)
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
echo "setup: ready ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
