"""Spark sessions for in-process integration tests, configured for this machine (local[2], no UI, venv Python).

Starting a SparkContext costs 8-15 s here, and its first Python worker, planner and commit runner a few
seconds more. So the test process keeps ONE shared context: :func:`make_spark` returns a new
``SparkSession`` on it (``newSession()``: its own SQL conf, temporary views, registered data sources and
streaming queries) with the module's settings, and a module fixture does not stop it. A module that
needs a context of its own (another master, e.g. ``local[2,3]`` for task retries) calls
:func:`own_spark`, which stops the shared context first (a JVM holds one SparkContext); the next
:func:`make_spark` starts a new shared one. The integration conftest stops it when the session ends.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_shared: Optional[Any] = None


def pythonpath_with_root(pythonpath: str) -> str:
    """``pythonpath`` with the repository first (once): Spark's Python workers import ``integration``."""
    paths = [p for p in pythonpath.split(os.pathsep) if p]
    return pythonpath if ROOT in paths else os.pathsep.join([ROOT, *paths])


def _worker_env() -> None:
    """Spark's Python workers inherit the driver's environment when the context starts: the venv's
    Python, and the repository on PYTHONPATH (tests pass functions from ``integration`` to workers)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = pythonpath_with_root(os.environ.get("PYTHONPATH", ""))


def _alive(spark: Optional[Any]) -> bool:
    return spark is not None and spark.sparkContext._jsc is not None


def make_spark(app: str = "twophase-tests", conf: dict[str, str] | None = None, cores: int = 2,
               new_session: bool = True) -> Any:
    """A new session with twophase's formats registered and ``conf`` (runtime SQL settings) set, on the
    shared local[cores] context (started on first use, restarted for another ``cores``). Do not ``stop()``
    it in a test: that would stop the context.

    ``new_session=False`` returns the context's own session instead: a Python data source registered with
    ``spark.dataSource.register`` on a ``newSession()`` is not found by a streaming query in PySpark 4.3
    (DATA_SOURCE_NOT_FOUND at start, or DATA_SOURCE_NOT_EXIST in the batch), so the benchmarks, which
    register a no-op sink, use this."""
    global _shared
    from pyspark.sql import SparkSession
    import twophase.spark

    master = f"local[{cores}]"
    if _alive(_shared) and _shared.sparkContext.master != master:
        stop_shared()
    if not _alive(_shared):
        _worker_env()
        active = SparkSession.getActiveSession()
        if _alive(active):  # a module's own context left running: one JVM holds one context
            active.stop()
        base = (SparkSession.builder.master(master).appName(app)
                .config("spark.ui.enabled", "false").getOrCreate())
        base.sparkContext.setLogLevel("ERROR")
        _shared = base
    spark = _shared.newSession() if new_session else _shared
    settings = {"spark.sql.shuffle.partitions": "3", "spark.sql.streaming.stopTimeout": "30s", **(conf or {})}
    for k, v in settings.items():
        spark.conf.set(k, v)
    twophase.spark.register(spark)
    return spark


def own_spark(builder: Any) -> Any:
    """``builder.getOrCreate()`` on a context of its own: stops the shared context first (else Spark would
    hand back the shared one, ignoring the builder's master). The caller stops what it gets.

    A builder with ``spark.jars`` (Spark's Kafka connector, hadoop-aws) needs a JVM of its own: the jars reach
    the driver's class path only when spark-submit launches the JVM; added to a context in a JVM already
    running (an earlier test module's), ``format("kafka")`` / ``s3a://`` are not found. So the running JVM is
    shut down and the next context launches a new one with the builder's settings."""
    stop_shared()
    if getattr(builder, "_options", {}).get("spark.jars"):
        _new_jvm()
    _worker_env()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _new_jvm() -> None:
    """Stop any context and the JVM behind PySpark's gateway; the next context launches a new JVM."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if _alive(active):
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:
        pass
    if proc is not None:
        proc.kill()
        proc.wait(30)
    SparkContext._gateway = None
    SparkContext._jvm = None


def stop_shared() -> None:
    """Stop the shared context, if one runs."""
    global _shared
    if _alive(_shared):
        _shared.stop()
    _shared = None
