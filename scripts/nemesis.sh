#!/usr/bin/env bash
# A nemesis campaign on a Spark standalone cluster started here (see integration/nemesis/campaign.py):
#
#   bash scripts/nemesis.sh --runs 30 --seed 7 [--sinks files,s3,delta,kafka,azure-files,azure-delta] [--faults executor_jvm,...]
#
# Each run: one sink, one fault kind, a fresh destination; every input record must come out exactly
# once, with no leftovers and every log record final. Prints a summary table per sink and fault kind.
# Takes about a minute per run on the 2-core machine; not part of the default test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
export PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
exec flock /tmp/twophase-spark.lock .venv/bin/python -m integration.nemesis.campaign "$@"
