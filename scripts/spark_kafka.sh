#!/usr/bin/env bash
# Spark's own Kafka connector (spark-sql-kafka-0-10 at PySpark's version) and the runtime jars PySpark does
# not bundle, for the connector tests (integration/kafka/spark_kafka.py) and the peer benchmark.
#   scripts/spark_kafka.sh fetch   resolve scripts/jvm/spark-kafka/pom.xml with mvn into .venv/jvm/spark-kafka/
# Nothing is downloaded by URL.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
POM="$ROOT/scripts/jvm/spark-kafka/pom.xml"
JARS="$ROOT/.venv/jvm/spark-kafka"
PY="$ROOT/.venv/bin/python"

fetch() {
  local version bundled
  version=$("$PY" -c 'import pyspark; print(pyspark.__version__)')
  if [ -f "$JARS/.complete" ] && [ "$(cat "$JARS/.complete")" = "$version" ]; then return; fi
  command -v mvn >/dev/null || { echo "spark_kafka: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  rm -rf "$JARS"; mkdir -p "$JARS"
  if ! mvn -q -B -f "$POM" dependency:copy-dependencies -Dspark.version="$version" \
         -DincludeScope=runtime -DoutputDirectory="$JARS" > "$JARS/.mvn.log" 2>&1; then
    # not served at PySpark's version (4.3.0 is not on Maven Central yet): the pom's spark.version
    echo "spark_kafka: spark-sql-kafka-0-10_2.13 $version not served; using the pom's spark.version" >&2
    mvn -q -B -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$JARS" >&2
  fi
  rm -f "$JARS/.mvn.log"
  # drop what PySpark bundles (same artifact, any version): PySpark's copy is the one on the classpath
  bundled=$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
  for jar in "$JARS"/*.jar; do
    local name; name=$(basename "$jar" .jar); name=${name%-*}   # artifactId (strip -<version>)
    if compgen -G "$bundled/$name-[0-9]*.jar" >/dev/null; then rm -f "$jar"; fi
  done
  echo "$version" > "$JARS/.complete"
}

case "${1:-}" in
  fetch) fetch ;;
  *) echo "usage: $0 fetch" >&2; exit 2 ;;
esac
