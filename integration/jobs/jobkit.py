"""What every streaming job of the tests shares: the SparkSession from ``--master``/``--conf`` options,
the application id file, task pacing, and running a query to its end with one exit-code convention.

The jobs (``integration/jobs/file_job.py``, ``integration/kafka/kafka_job.py``,
``integration/nemesis/job.py``) run as scripts, in their own process, with this folder put on
``sys.path``: they need nothing of the repository but this module and the installed twophase.

Exit codes of :func:`run_query`: 0 the query finished, 2 it failed, 3 it timed out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Iterator, Sequence


def add_file_job_arguments(ap: argparse.ArgumentParser) -> None:
    """What the file-input jobs (``file_job.py``, ``native_job.py``) share: ``--input`` (JSON lines read one file
    per ``--files-per-batch``), ``--out``, ``--checkpoint``, ``--format``, ``--partitions``, ``--partition-by``."""
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--format", default="parquet")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--partition-by", default="")
    ap.add_argument("--files-per-batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=240)


def add_spark_arguments(ap: argparse.ArgumentParser, *, master: str = "") -> None:
    """``--master``, ``--conf KEY=VALUE`` (repeatable), ``--app-id-file``, ``--pace``, ``--pace-rows``."""
    ap.add_argument("--master", default=master, help="Spark master URL")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    ap.add_argument("--app-id-file", default="", help="write the Spark application id here once started")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds to sleep before each --pace-rows rows")
    ap.add_argument("--pace-rows", type=int, default=20)


def spark_session(ap: argparse.ArgumentParser, args: argparse.Namespace, *, master: str, app_name: str,
                  settings: Sequence[tuple[str, str]] = (), log_level: str = "ERROR") -> Any:
    """A SparkSession with ``settings`` and every ``--conf``; records the app id in ``--app-id-file``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.ui.enabled", "false")
    for key, value in settings:
        builder = builder.config(key, value)
    for kv in args.conf:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--conf {kv!r}: expected KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if args.app_id_file:
        with open(args.app_id_file + ".tmp", "w") as f:
            f.write(spark.sparkContext.applicationId)
        os.replace(args.app_id_file + ".tmp", args.app_id_file)
    return spark


def paced(seconds: float, rows: int, straggle: float = 0.0) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInPandas function passing every row through, sleeping ``seconds`` before each ``rows`` rows;
    with ``straggle`` > 0 the first attempt of partition 0 sleeps that long first (for speculation)."""
    def run(frames: Iterator[Any]) -> Iterator[Any]:
        if straggle > 0:
            from pyspark import TaskContext
            ctx = TaskContext.get()
            if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                time.sleep(straggle)
        for frame in frames:
            step = rows if seconds > 0 else max(len(frame), 1)
            for start in range(0, len(frame), step):
                if seconds > 0:
                    time.sleep(seconds)
                yield frame.iloc[start:start + step]
    return run


def run_query(name: str, writer: Any, timeout: float, spark: Any, *, progress: bool = False) -> int:
    """Start ``writer`` (a DataStreamWriter), wait up to ``timeout`` s; print the outcome; stop Spark."""
    started = time.time()
    q = writer.start()
    if not q.awaitTermination(timeout):
        q.stop()
        print(f"{name}: timed out after {timeout}s", file=sys.stderr)
        return 3
    if q.exception() is not None:
        print(f"{name}: query failed: {q.exception()}", file=sys.stderr)
        return 2
    print(f"{name}: done in {time.time() - started:.1f}s, batches={len(q.recentProgress)}")
    if progress:
        for p in q.recentProgress:
            print(f"{name}: batch {p['batchId']} rows={p['numInputRows']} durations={p['durationMs']}")
    spark.stop()
    return 0
