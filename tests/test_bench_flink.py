"""bench/bench_flink.py without timing anything: its checks, its source, its refusal when no PyFlink venv is
given (all instant), and a tiny end-to-end run only when ``TWOPHASE_FLINK_PYTHON`` names a PyFlink venv
(skipped otherwise, so the default suite's time does not change)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "bench_flink.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_flink_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_verify_accepts_exactly_once_and_names_each_fault(bench):
    rows = [(i, i % bench.KEYS, i // bench.KEYS + 1) for i in range(3000)]
    assert bench.verify(rows, 3000) == "ok"
    assert "1 duplicates" in bench.verify(rows + [rows[5]], 3000)
    assert "ids missing" in bench.verify(rows[1:], 3000)
    recount = [(i, k, n + 1 if i == 7 else n) for i, k, n in rows]  # a running count off by one
    assert "counts are not 1..m" in bench.verify(recount, 3000)


def test_sequence_source_replays_from_a_position(bench):
    src = bench.SequenceSource(10, 30, splits=2)
    r = src.open_reader("1", None)
    first = r.read(3)
    pos = r.position()
    rest = r.read(100)
    assert [x["id"] for x in first.records] == [11, 13, 15] and not first.finished
    assert [x["id"] for x in rest.records] == list(range(17, 30, 2)) and rest.finished
    again = src.open_reader("1", pos).read(100)
    assert again.records == rest.records


def test_missing_flink_python_names_how_to_set_it_up(bench, monkeypatch):
    monkeypatch.delenv("TWOPHASE_FLINK_PYTHON", raising=False)
    with pytest.raises(SystemExit) as e:
        bench.flink_python(None)
    assert "scripts/flink_venv.sh" in str(e.value) and "TWOPHASE_FLINK_PYTHON" in str(e.value)
    with pytest.raises(SystemExit) as e:
        bench.flink_python("/nonexistent/bin/python")
    assert "not an executable Python" in str(e.value)


@pytest.mark.skipif(not os.environ.get("TWOPHASE_FLINK_PYTHON"), reason="no PyFlink venv (TWOPHASE_FLINK_PYTHON)")
def test_tiny_run_both_sides_exactly_once():
    p = subprocess.run([sys.executable, str(BENCH), "--records", "2000", "--repeat", "1", "--flink-configs", "sql-row",
                        "--flink-warmup", "0"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    table = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 3 and all(line.rstrip(" |").endswith("ok") for line in table[1:]), p.stdout  # header, 3 jobs
