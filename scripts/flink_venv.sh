#!/usr/bin/env bash
# Creates the PyFlink virtualenv that bench/bench_flink.py runs Flink's side in:
#   bash scripts/flink_venv.sh [DIR]      (default: $TWOPHASE_FLINK_VENV or ~/flinkvenv)
# then: export TWOPHASE_FLINK_PYTHON=DIR/bin/python   (or pass --flink-python DIR/bin/python)
#
# A SEPARATE venv on purpose: apache-flink pins old pyarrow/pandas/numpy/protobuf (via apache-beam) that
# would break the project's own .venv. PyFlink's local mini-cluster needs Java 11+ (`java` on PATH).
# APACHE_FLINK_VERSION=2.3.0 pins the release (the README's table was measured with 2.3.0).
set -euo pipefail
dir="${1:-${TWOPHASE_FLINK_VENV:-$HOME/flinkvenv}}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || { echo "flink_venv.sh: $py not found; PyFlink 2.x wheels exist for Python 3.9-3.12 (set PYTHON=...)" >&2; exit 1; }
command -v java >/dev/null || echo "flink_venv.sh: warning: no java on PATH; the mini-cluster needs Java 11+ (apt-get install openjdk-17-jre-headless)" >&2
if [ ! -x "$dir/bin/python" ]; then
  "$py" -m venv "$dir"
fi
"$dir/bin/pip" install -q --upgrade pip
"$dir/bin/pip" install "apache-flink${APACHE_FLINK_VERSION:+==$APACHE_FLINK_VERSION}"
"$dir/bin/python" -c "import importlib.metadata as m; print('apache-flink', m.version('apache-flink'), 'in $dir')"
echo "export TWOPHASE_FLINK_PYTHON=$dir/bin/python"
