#!/bin/bash
# Hadoop's S3A filesystem (hadoop-aws, at the Hadoop version PySpark bundles) and the AWS SDK v2 modules it
# loads, for Spark on the project's S3 server (integration/s3/test_s3a_reader.py, bench/bench_s3_spark.py).
#
#   scripts/hadoop_aws.sh fetch   resolve scripts/jvm/hadoop-aws/pom.xml with mvn into .venv/jvm/hadoop-aws-<version>/
#   scripts/hadoop_aws.sh jars    print the jars, comma-separated (for spark.jars)
#
# The SDK's full bundle is not fetched (~600 MB): only s3 and s3-transfer-manager with their dependencies,
# less what PySpark's jars already hold (netty, httpclient, commons-codec, slf4j): about 10 MB.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
POM="$ROOT/scripts/jvm/hadoop-aws/pom.xml"
VERSION=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$POM")
JARS="$ROOT/.venv/jvm/hadoop-aws-$VERSION"

check_version() {
  local bundled
  bundled=$("$PY" -c 'import glob, os, pyspark; print(" ".join(sorted(os.path.basename(p)[len("hadoop-client-api-"):-4] for p in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))))')
  if [ "$bundled" != "$VERSION" ]; then
    echo "hadoop_aws: PySpark bundles Hadoop '$bundled' but scripts/jvm/hadoop-aws/pom.xml has hadoop.version $VERSION;" \
         "set hadoop.version (and awssdk.version, from that Hadoop's hadoop-project pom) to match; not fetched" \
         "(the S3A tests skip)" >&2
    return 1
  fi
}

fetch() {
  check_version || return 0
  if [ -f "$JARS/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "hadoop_aws: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mkdir -p "$JARS"
  mvn -q -B -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$JARS" \
      -DexcludeGroupIds=io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j >&2
  touch "$JARS/.complete"
}

case "${1:-}" in
  fetch) fetch ;;
  jars) [ -f "$JARS/.complete" ] || { echo "hadoop_aws: not fetched: run scripts/hadoop_aws.sh fetch" >&2; exit 1; }
        ls "$JARS"/*.jar | paste -sd, - ;;
  *) echo "usage: $0 fetch | jars" >&2; exit 2 ;;
esac
