"""The embedded runtime against Flink (PyFlink's local mini-cluster), in one run (no timed asserts; prints a
markdown table).

The job on both sides: 2 sources (2 splits each) -> union -> key_by(id % 1000) -> keyed running count
(p=2) -> exactly-once file sink (p=2), aligned checkpoints every 100 ms, ``--records`` records with ids
0..N-1, bounded (each job ends after a final checkpoint has committed everything).

twophase (this venv, in this process): a Python split source that makes ``{"id": i, "k": i % 1000}`` as it
reads (position = next id), ``JobGraph`` / ``JobRunner``, ``twophase.sinks.files.FileSink`` in CSV (the
row-format peer) and in Parquet (the bulk-format peer).

Flink (a subprocess under the PyFlink venv's Python, ``bench/_flink_job.py``): Java ``NumberSequenceSource``
sources, FileSink in row format (``SimpleStringEncoder``) and bulk format (``CsvBulkWriters``: the
PyFlink wheel ships no Parquet format jar), the keyed count either a Python UDF (``udf-*``) or Java
(``sql-*``, an over-aggregation). See that file's docstring.

After each job the output is read back: every id 0..N-1 exactly once (count and distinct ids), and for
each key the running counts are exactly 1..m (no record counted twice or skipped by the state).

    .venv/bin/python bench/bench_flink.py --flink-python /path/to/flinkvenv/bin/python [--records 1000000] [--repeat 2]

The PyFlink venv: ``bash scripts/flink_venv.sh [DIR]`` (never the project's venv: apache-flink pins old
pyarrow/pandas). Give its Python with ``--flink-python`` or ``TWOPHASE_FLINK_PYTHON``. Run it under
``flock /tmp/twophase-spark.lock`` on the shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from twophase.runtime import CheckpointConfig, JobGraph, JobRunner, ReadResult, Source, SplitReader  # noqa: E402
from twophase.runtime import job as _job  # noqa: E402
from twophase.sinks.files import FileSink  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FLINK_JOB = os.path.join(HERE, "_flink_job.py")
KEYS = 1000
FLINK_CONFIGS = ("udf-row", "udf-bulk", "udf-row-thread", "udf-bulk-thread", "sql-row", "sql-bulk")
SETUP_HINT = ("create it with `bash scripts/flink_venv.sh /path/to/flinkvenv` (a separate virtualenv with "
              "`pip install apache-flink`; Java 11+ on PATH), then pass --flink-python /path/to/flinkvenv/bin/python "
              "or export TWOPHASE_FLINK_PYTHON=/path/to/flinkvenv/bin/python")


# --------------------------------------------------------------------------- twophase side


class _SeqReader(SplitReader):
    def __init__(self, start: int, end: int, step: int) -> None:
        self.pos, self.end, self.step = start, end, step

    def read(self, max_records: int) -> ReadResult:
        stop = min(self.pos + max_records * self.step, self.end)
        out = [{"id": i, "k": i % KEYS} for i in range(self.pos, stop, self.step)]
        if out:
            self.pos = out[-1]["id"] + self.step
        return ReadResult(out, self.pos >= self.end)

    def position(self) -> int:
        return self.pos


class SequenceSource(Source):
    """ids ``[start, end)`` in ``splits`` interleaved splits, records made as they are read (the peer of
    Flink's ``NumberSequenceSource``); position = the next id of the split (replayable)."""

    def __init__(self, start: int, end: int, splits: int = 2) -> None:
        self.start, self.end, self.n = start, end, splits

    def splits(self) -> list[str]:
        return [str(i) for i in range(self.n)]

    def open_reader(self, split_id: str, position: Optional[Any]) -> SplitReader:
        first = self.start + int(split_id)
        return _SeqReader(first if position is None else int(position), self.end, self.n)


def build_twophase(out: str, n: int, fmt: str) -> JobGraph:
    g = JobGraph("bench-flink", default_parallelism=2)
    half = n // 2
    a = g.source(SequenceSource(0, half), uid="a")
    b = g.source(SequenceSource(half, n), uid="b")

    def count(v, st):
        c = st.value(0) + 1
        st.update(c)
        return {"id": v["id"], "k": v["k"], "n": c}
    a.union(b).key_by(lambda r: r["k"]).map(count, uid="count") \
        .sink_to(FileSink.from_options({"path": out, "format": fmt}), uid="out")
    return g


@contextlib.contextmanager
def commit_times() -> Iterator[list[tuple[int, float, float]]]:
    """Bench-only instrumentation, undone on exit: (checkpoint id, triggered_at, committed_at) per completed
    checkpoint, in time.time(). The runner's completion listener runs after the coordinator committed
    (``CheckpointCoordinator._complete_and_commit``: durable decision, commit, then the listeners)."""
    seen: list[tuple[int, float, float]] = []
    orig = _job._Attempt.on_completed

    def on_completed(self, completed):
        seen.append((completed.checkpoint_id, completed.triggered_at, time.time()))
        return orig(self, completed)
    _job._Attempt.on_completed = on_completed
    try:
        yield seen
    finally:
        _job._Attempt.on_completed = orig


def run_twophase(n: int, fmt: str, workdir: str, tag: str) -> dict:
    out = os.path.join(workdir, f"twophase-{tag}-{fmt}")
    g = build_twophase(out, n, fmt)
    runner = JobRunner(g, checkpointing=CheckpointConfig(0.1, mode="aligned"))
    with commit_times() as committed:
        t = time.perf_counter()
        result = runner.run()
        wall = time.perf_counter() - t
    m = result.metrics
    return {"side": "twophase", "config": f"twophase-{fmt}", "records": n, "out": out, "run_s": wall, "wall_s": wall,
            "completed": len(m.checkpoints_completed), "declined": 0,
            "trigger_to_completed_s": list(m.checkpoint_durations_s),
            "trigger_to_committed_s": [c - t0 for _, t0, c in committed]}


def read_twophase(out: str, fmt: str) -> list[tuple[int, int, int]]:
    files = [f for f in glob.glob(os.path.join(out, "part-*")) if os.path.isfile(f)]
    rows: list[tuple[int, int, int]] = []
    if fmt == "parquet":
        for f in files:
            t = pq.read_table(f, columns=["id", "k", "n"])
            rows += zip(t.column("id").to_pylist(), t.column("k").to_pylist(), t.column("n").to_pylist())
    else:
        for f in files:
            with open(f) as fh:
                for line in fh:
                    if not line[:1].isdigit():  # the header line
                        continue
                    a, b, c = line.rstrip("\n").split(",")
                    rows.append((int(a), int(b), int(c)))
    return rows


# --------------------------------------------------------------------------- Flink side


def flink_python(arg: Optional[str]) -> str:
    path = arg or os.environ.get("TWOPHASE_FLINK_PYTHON")
    if not path:
        raise SystemExit(f"bench_flink.py: no PyFlink Python given; {SETUP_HINT}")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit(f"bench_flink.py: {path!r} (from --flink-python / TWOPHASE_FLINK_PYTHON) is not an "
                         f"executable Python; {SETUP_HINT}")
    probe = subprocess.run([path, "-c", "import pyflink, importlib.metadata as m; print(m.version('apache-flink'))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"bench_flink.py: {path} cannot import pyflink ({probe.stderr.strip().splitlines()[-1:]}); "
                         f"{SETUP_HINT}")
    if shutil.which("java") is None:
        raise SystemExit("bench_flink.py: no `java` on PATH; PyFlink's mini-cluster needs Java 11 or newer "
                         "(apt-get install openjdk-17-jre-headless)")
    return path


def run_flink(py: str, configs: list[str], n: int, workdir: str, tag: str, extra_conf: list[str],
              warmup: int, timeout_s: float) -> list[dict]:
    out = os.path.join(workdir, f"flink-{tag}")
    log_dir = os.path.join(workdir, f"flink-log-{tag}")
    os.makedirs(log_dir)
    env = dict(os.environ, FLINK_LOG_DIR=log_dir)
    env.pop("PYTHONPATH", None)  # the project's path must not leak into the PyFlink venv
    cmd = [py, FLINK_JOB, "--configs", ",".join(configs), "--records", str(n), "--out", out,
           "--warmup", str(warmup)] + [a for kv in extra_conf for a in ("--conf", kv)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench_flink.py: the Flink run took over {timeout_s:.0f}s (--flink-timeout); Flink's log is "
                         f"in {log_dir}")
    results = [json.loads(line[len("RESULT "):]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or len(results) != len(configs):
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-8000:])
        raise SystemExit(f"bench_flink.py: the Flink run failed (exit {p.returncode}); Flink's log is in {log_dir}")
    for r in results:
        r["side"] = "flink"
        r["run_s"] = r["net_runtime_s"]
        ck = r["checkpoints"]
        r["completed"] = len(ck)
        r["declined"] = len(r["declined"])
        r["trigger_to_completed_s"] = [c["duration_ms"] / 1e3 for c in ck]
        r["trigger_to_committed_s"] = flink_commit_times(r["out"], ck)
    return results


def flink_files(out: str) -> list[str]:
    """Finished part files (in-progress and pending files are hidden: ``.part-*``)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if not f.startswith(".")]


def flink_commit_times(out: str, checkpoints: list[dict]) -> list[float]:
    """Trigger -> committed per checkpoint that committed a file. Flink's FileSink committer renames a
    checkpoint's pending files into place after the checkpoint completed (notifyCheckpointComplete), and a
    rename sets the file's ctime: a file belongs to the latest checkpoint completed before its ctime."""
    done = sorted((c["trigger_ms"] / 1e3 + c["duration_ms"] / 1e3, c["trigger_ms"] / 1e3) for c in checkpoints
                  if c.get("trigger_ms"))
    last: dict[float, float] = {}
    for f in flink_files(out):
        ct = os.stat(f).st_ctime
        owner = [d for d in done if d[0] <= ct + 0.002]  # the log's completion is ms-rounded
        if owner:
            trig = owner[-1][1]
            last[trig] = max(last.get(trig, 0.0), ct)
    return [c - t for t, c in sorted(last.items())]


def read_flink(out: str) -> list[tuple[int, int, int]]:
    rows = []
    for f in flink_files(out):
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                if line.startswith("+I["):  # Row.toString() of the sql-row configuration
                    line = line[3:-1]
                a, b, c = line.split(",")
                rows.append((int(a), int(b), int(c)))
    return rows


# --------------------------------------------------------------------------- checks and table


def verify(rows: list[tuple[int, int, int]], n: int) -> str:
    """"ok" when ids 0..n-1 appear once each and every key's running counts are 1..m; else what is wrong."""
    ids = [r[0] for r in rows]
    distinct = set(ids)
    problems = []
    if len(ids) != n:
        problems.append(f"{len(ids)} records for {n}")
    if len(distinct) != len(ids):
        problems.append(f"{len(ids) - len(distinct)} duplicates")
    if distinct != set(range(n)):
        problems.append(f"{len(set(range(n)) - distinct)} ids missing")
    per_key: dict[int, list[int]] = {}
    for i, k, c in rows:
        if k != i % KEYS:
            problems.append(f"id {i} has key {k}")
            break
        per_key.setdefault(k, []).append(c)
    bad = [k for k, cs in per_key.items() if sorted(cs) != list(range(1, len(cs) + 1))]
    if bad:
        problems.append(f"{len(bad)} keys whose counts are not 1..m")
    return "ok" if not problems else "; ".join(problems)


def ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    p95 = xs[max(0, math.ceil(0.95 * len(xs)) - 1)]  # nearest rank
    return f"{statistics.median(xs) * 1e3:.0f} / {p95 * 1e3:.0f} / {xs[-1] * 1e3:.0f}"


DESCRIBE = {
    "twophase-csv": ("twophase runtime", "Python (generated)", "Python thread", "twophase FileSink, CSV (row)"),
    "twophase-parquet": ("twophase runtime", "Python (generated)", "Python thread", "twophase FileSink, Parquet (bulk)"),
    "udf-row": ("PyFlink DataStream", "Java NumberSequenceSource", "Python UDF", "FileSink row format"),
    "udf-bulk": ("PyFlink DataStream", "Java NumberSequenceSource", "Python UDF", "FileSink bulk, CSV"),
    "udf-row-thread": ("PyFlink DataStream", "Java NumberSequenceSource", "Python UDF (thread mode)",
                       "FileSink row format"),
    "udf-bulk-thread": ("PyFlink DataStream", "Java NumberSequenceSource", "Python UDF (thread mode)",
                        "FileSink bulk, CSV"),
    "sql-row": ("Flink SQL over-agg -> DataStream", "Java NumberSequenceSource", "Java", "FileSink row format"),
    "sql-bulk": ("Flink SQL over-agg -> DataStream", "Java NumberSequenceSource", "Java", "FileSink bulk, CSV"),
}
BASELINE = {"twophase-csv": "twophase-csv", "twophase-parquet": "twophase-parquet", "udf-row": "twophase-csv",
            "udf-bulk": "twophase-parquet", "udf-row-thread": "twophase-csv",
            "udf-bulk-thread": "twophase-parquet", "sql-row": "twophase-csv", "sql-bulk": "twophase-parquet"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--flink-python", help="the PyFlink venv's python (else $TWOPHASE_FLINK_PYTHON)")
    ap.add_argument("--flink-configs", default=",".join(FLINK_CONFIGS),
                    help=f"comma-separated subset of {', '.join(FLINK_CONFIGS)}")
    ap.add_argument("--flink-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra Flink option for every Flink job (repeatable)")
    ap.add_argument("--flink-warmup", type=int, default=20_000,
                    help="records of an untimed job per Flink configuration and round (JIT, Python worker)")
    ap.add_argument("--flink-timeout", type=float, default=1800.0, help="seconds for one round's Flink subprocess")
    ap.add_argument("--keep", action="store_true", help="keep the outputs (their directory is printed)")
    args = ap.parse_args()
    configs = [c for c in args.flink_configs.split(",") if c]
    unknown = [c for c in configs if c not in FLINK_CONFIGS]
    if unknown or args.records < 2 or args.repeat < 1:
        ap.error(f"unknown Flink configurations {unknown}" if unknown else "--records >= 2 and --repeat >= 1")
    py = flink_python(args.flink_python)
    flink_version = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('apache-flink'))"],
                                   capture_output=True, text=True).stdout.strip()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    workdir = tempfile.mkdtemp(prefix="twophase-bench-flink-")
    runs: dict[str, list[dict]] = {}
    try:
        pa.RecordBatch.from_pylist([{"warm": 1}])
        for fmt in ("csv", "parquet"):  # untimed warm-up of the twophase side
            run_twophase(10_000, fmt, workdir, f"warmup-{fmt}")
        for rnd in range(args.repeat):  # interleaved rounds, so both sides see the same machine state
            for fmt in ("csv", "parquet"):
                r = run_twophase(args.records, fmt, workdir, f"r{rnd}")
                r["check"] = verify(read_twophase(r["out"], fmt), args.records)
                runs.setdefault(r["config"], []).append(r)
            for r in run_flink(py, configs, args.records, workdir, f"r{rnd}", args.flink_conf, args.flink_warmup,
                               args.flink_timeout):
                r["check"] = verify(read_flink(r["out"]), args.records)
                runs.setdefault(r["config"], []).append(r)
            print(f"round {rnd + 1}/{args.repeat}: " + ", ".join(
                f"{c} {rs[-1]['records'] / rs[-1]['run_s']:,.0f}/s [{rs[-1]['check']}]" for c, rs in runs.items()),
                file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"outputs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    best = {c: max(rs, key=lambda r: r["records"] / r["run_s"]) for c, rs in runs.items()}
    rate = {c: b["records"] / b["run_s"] for c, b in best.items()}
    print(f"\n2 sources (2 splits each) -> union -> key_by(id % {KEYS}) -> keyed running count (p=2) -> exactly-once "
          f"file sink (p=2), aligned checkpoints every 100 ms; {args.records:,} records, best of {args.repeat} "
          f"interleaved rounds; {os.cpu_count()} cores; Python {platform.python_version()}, apache-flink "
          f"{flink_version}{' ' + ' '.join(args.flink_conf) if args.flink_conf else ''}, {java}\n")
    print("| side | source | keyed count in | sink | records/s | x twophase (same sink kind) | job wall s | "
          "checkpoints completed (declined) | trigger -> completed ms, median / p95 / max | "
          "trigger -> committed ms, median / p95 / max | exactly once (all rounds) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for c in ["twophase-csv", "twophase-parquet"] + configs:
        if c not in best:
            continue
        b, rs = best[c], runs[c]
        side, src, count, sink = DESCRIBE[c]
        checks = sorted({r["check"] for r in rs})
        ckpts = ", ".join(f"{r['completed']}" + (f" ({r['declined']})" if r["declined"] else "") for r in rs)
        print(f"| {side} (`{c}`) | {src} | {count} | {sink} | {rate[c]:,.0f} | **{rate[c] / rate[BASELINE[c]]:.2f}** | "
              f"{b['wall_s']:.2f} | {ckpts} | "
              f"{ms([x for r in rs for x in r['trigger_to_completed_s']])} | "
              f"{ms([x for r in rs for x in r['trigger_to_committed_s']])} | {', '.join(checks)} |")
    print("\nrecords/s: twophase over `JobRunner.run()`; Flink over the job's net runtime in the mini-cluster "
          "(JobExecutionResult, without JVM and mini-cluster start-up, which 'job wall s' includes). Checkpoint "
          "times pooled over the rounds. Flink's trigger -> completed is the CheckpointCoordinator's "
          "checkpointDuration; its commit is dated by the committed files' ctime (the FileSink committer's rename).")
    return 0 if all(r["check"] == "ok" for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
