#!/bin/bash
# Hadoop's ABFS filesystem (hadoop-azure, at the Hadoop version PySpark bundles) for delta-spark on Azurite
# (integration/delta_spark/test_delta_azure_oracle.py): abfs:// in its Blob-endpoint mode, the one Azurite speaks.
#
#   scripts/hadoop_azure.sh fetch   resolve scripts/jvm/hadoop-azure/pom.xml with mvn into $VENV/jvm/hadoop-azure-<version>/
#   scripts/hadoop_azure.sh jars    print the jars, comma-separated (for spark.jars)
#
# VENV: TWOPHASE_HADOOP_AZURE_VENV, default .venv-delta (scripts/setup_delta.sh calls this script). About 1.4 MB:
# hadoop-azure, wildfly-openssl and HdrHistogram; Hadoop 3.5's WASB driver (wasb://) is a stub that refuses
# every call, so its SDK (azure-storage) is not fetched.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/${TWOPHASE_HADOOP_AZURE_VENV:-.venv-delta}"
PY="$VENV/bin/python"
POM="$ROOT/scripts/jvm/hadoop-azure/pom.xml"
VERSION=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$POM")
JARS="$VENV/jvm/hadoop-azure-$VERSION"

check_version() {
  local bundled
  bundled=$("$PY" -c 'import glob, os, pyspark; print(" ".join(sorted(os.path.basename(p)[len("hadoop-client-api-"):-4] for p in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))))')
  if [ "$bundled" != "$VERSION" ]; then
    echo "hadoop_azure: $VENV's PySpark bundles Hadoop '$bundled' but scripts/jvm/hadoop-azure/pom.xml has" \
         "hadoop.version $VERSION; set it to match; not fetched (the delta-spark Azure test skips)" >&2
    return 1
  fi
}

fetch() {
  [ -x "$PY" ] || { echo "hadoop_azure: no $PY (run scripts/setup_delta.sh)" >&2; exit 1; }
  check_version || return 0
  if [ -f "$JARS/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "hadoop_azure: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mkdir -p "$JARS"
  mvn -q -B -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$JARS" \
      -DexcludeGroupIds=org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j >&2
  touch "$JARS/.complete"
}

case "${1:-}" in
  fetch) fetch ;;
  jars) [ -f "$JARS/.complete" ] || { echo "hadoop_azure: not fetched: run scripts/hadoop_azure.sh fetch" >&2; exit 1; }
        ls "$JARS"/*.jar | paste -sd, - ;;
  *) echo "usage: $0 fetch | jars" >&2; exit 2 ;;
esac
