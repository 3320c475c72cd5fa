#!/bin/bash
# twophase's S3A committer (scripts/jvm/s3a-committer: two Java classes for the native path on s3a://),
# built with mvn into .venv/jvm/s3a-committer/twophase-s3a-committer.jar. Skipped (with a note) when the
# hadoop-aws jars are not fetched: the native path on s3a:// then refuses to start, naming this script.
#
#   scripts/s3a_committer.sh build   build the jar (again when a source is newer than it)
#   scripts/s3a_committer.sh jar     print the jar's path
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC="$ROOT/scripts/jvm/s3a-committer"
JAR="$ROOT/.venv/jvm/s3a-committer/twophase-s3a-committer.jar"

build() {
  if [ -f "$JAR" ] && [ -z "$(find "$SRC" -newer "$JAR" -type f | head -1)" ]; then return; fi
  command -v mvn >/dev/null || { echo "s3a_committer: Maven (mvn) is needed: apt-get install maven" >&2; exit 1; }
  mvn -q -B -f "$SRC/pom.xml" package >&2
}

case "${1:-}" in
  build) build ;;
  jar) [ -f "$JAR" ] || { echo "s3a_committer: not built: run scripts/s3a_committer.sh build" >&2; exit 1; }
       echo "$JAR" ;;
  *) echo "usage: $0 build | jar" >&2; exit 2 ;;
esac
