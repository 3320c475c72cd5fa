#!/usr/bin/env bash
# The second environment .venv-delta, beside .venv, for the Delta-on-Spark tests (integration/delta_spark):
# Delta Lake's own engine (delta-spark) reads every table twophase-delta writes. No Delta release supports
# PySpark 4.3 (the main .venv), so this one pins the newest pair that resolves together:
#   PySpark $PYSPARK_SPEC with delta-spark $DELTA_SPARK_VERSION (PyPI), twophase[delta,azure,test] editable,
#   Delta's jars (io.delta:delta-spark_<spark minor>_2.13 and io.delta:delta-storage, the same version) through mvn from
#   scripts/jvm/delta/pom.xml into .venv-delta/jvm/delta-<version>/, handed to Spark with spark.jars (no Ivy).
# Idempotent and quick when done (a stamp per step). Needs Java 17 and mvn (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DELTA_SPARK_VERSION=${DELTA_SPARK_VERSION:-4.4.0}
PYSPARK_SPEC=${PYSPARK_SPEC:-"pyspark>=4.2,<4.3"}
VENV=.venv-delta
JARS="$ROOT/$VENV/jvm/delta-$DELTA_SPARK_VERSION"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_delta: creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.twophase-installed-$DELTA_SPARK_VERSION"
# (azure: twophase-delta writes the Azure oracle test's table on Azurite; a venv made before it gets it here)
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || ! "$VENV/bin/python" -c "import azure.storage.blob" 2>/dev/null; then
  echo "setup_delta: installing delta-spark $DELTA_SPARK_VERSION, $PYSPARK_SPEC and twophase[delta,azure,test] into $VENV"
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip \
         && "$VENV/bin/python" -m pip install "delta-spark==$DELTA_SPARK_VERSION" "$PYSPARK_SPEC" -e ".[delta,azure,test]"; } \
        > "$VENV/setup.log" 2>&1; then
    tail -40 "$VENV/setup.log"; echo "setup_delta: pip install failed (full log: $VENV/setup.log)"; exit 1
  fi
  "$VENV/bin/python" -c "import twophase, pyspark, delta, deltalake, azure.storage.blob, pytest"
  touch "$STAMP"
fi
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$ROOT/spark_discovery" > "$SITE/twophase-spark-discovery.pth"
if [ ! -f "$JARS/.complete" ]; then
  command -v mvn >/dev/null || { echo "setup_delta: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mkdir -p "$JARS"
  SPARK_BINARY=$("$VENV/bin/python" -c 'import pyspark; print(".".join(pyspark.__version__.split(".")[:2]))')
  # only Delta's own jars: Spark's (and Scala's) come with PySpark
  mvn -q -B -f "$ROOT/scripts/jvm/delta/pom.xml" dependency:copy-dependencies -Ddelta.version="$DELTA_SPARK_VERSION" -Dspark.binary="$SPARK_BINARY" \
      -DincludeScope=runtime -DincludeGroupIds=io.delta -DoutputDirectory="$JARS" >&2
  touch "$JARS/.complete"
fi
# Hadoop's S3A (hadoop-aws at the Hadoop this PySpark bundles, and the AWS SDK modules it loads) for delta-spark on
# the project's S3 server (integration/delta_spark/test_delta_s3_oracle.py): scripts/jvm/hadoop-aws/pom.xml, the
# main venv's pom, resolved into .venv-delta/jvm/hadoop-aws-<version>/ when that pom's hadoop.version is this
# PySpark's Hadoop (its awssdk.version is that Hadoop's); otherwise not fetched and the S3 oracle test skips
HADOOP_POM="$ROOT/scripts/jvm/hadoop-aws/pom.xml"
HADOOP_PINNED=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$HADOOP_POM")
HADOOP_BUNDLED=$("$VENV/bin/python" -c 'import glob, os, pyspark; print(" ".join(sorted(os.path.basename(p)[len("hadoop-client-api-"):-4] for p in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))))')
S3A_JARS="$ROOT/$VENV/jvm/hadoop-aws-$HADOOP_BUNDLED"
if [ "$HADOOP_BUNDLED" != "$HADOOP_PINNED" ]; then
  echo "setup_delta: $VENV's PySpark bundles Hadoop '$HADOOP_BUNDLED', scripts/jvm/hadoop-aws/pom.xml pins $HADOOP_PINNED:" \
       "hadoop-aws not fetched for $VENV (the delta-spark S3 tests skip)" >&2
elif [ ! -f "$S3A_JARS/.complete" ]; then
  command -v mvn >/dev/null || { echo "setup_delta: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mkdir -p "$S3A_JARS"
  mvn -q -B -f "$HADOOP_POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$S3A_JARS" \
      -DexcludeGroupIds=io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j >&2
  touch "$S3A_JARS/.complete"
fi
# Hadoop's ABFS (hadoop-azure at the Hadoop this PySpark bundles) for delta-spark on Azurite
# (integration/delta_spark/test_delta_azure_oracle.py): scripts/jvm/hadoop-azure/pom.xml into
# .venv-delta/jvm/hadoop-azure-<version>/, ~1.4 MB; not fetched (the test skips) when that pom pins another Hadoop
TWOPHASE_HADOOP_AZURE_VENV="$VENV" bash "$ROOT/scripts/hadoop_azure.sh" fetch
echo "setup_delta: ready ($("$VENV/bin/python" -c 'import pyspark, importlib.metadata as m; print("pyspark", pyspark.__version__, "delta-spark", m.version("delta-spark"))'))"
