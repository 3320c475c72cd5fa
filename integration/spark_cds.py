"""A class-data-sharing (AppCDS) archive of the Spark driver JVM's classes, for the test suite's many
Spark launches (every crash-chain run, every job of the nemesis, each test module's context).

Starting a Spark driver here spends most of its 8-15 s loading and verifying classes. Java 17 can dump
the classes a JVM loaded into an archive (``-XX:ArchiveClassesAtExit``) and map it at the next start
(``-XX:SharedArchiveFile``): measured here, a SparkSession start went from 10-12 s to 6-7 s and a crash
test's job from 35-38 s to 27-30 s. The archive is built once per venv, JDK and PySpark (a training run
of a small streaming query into twophase-file, ~30 s), kept under ``.venv/spark-cds/``, and handed to
every driver the tests start through ``PYSPARK_SUBMIT_ARGS`` (``--driver-java-options``), which PySpark
reads when it launches its JVM, in this process and in every job subprocess (they inherit it).

It changes no behaviour: a JVM whose class path differs from the archive's just loads classes the usual
way (its warnings are switched off). ``TWOPHASE_SPARK_CDS=0`` turns it off; a failed training run only
means no archive (logged), never a failed test.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from typing import Optional

from integration.spark_session import ROOT, pythonpath_with_root
_log = logging.getLogger(__name__)

TRAIN = textwrap.dedent('''
    import os, sys, tempfile
    from pyspark.sql import SparkSession
    import twophase.spark
    spark = (SparkSession.builder.master("local[2]").appName("twophase-cds-training")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    twophase.spark.register(spark)
    work = tempfile.mkdtemp(prefix="twophase-cds-")
    spark.range(0, 200, numPartitions=2).selectExpr("id", "id % 3 AS grp").write.json(work + "/in")
    q = (spark.readStream.schema("id LONG, grp LONG").option("maxFilesPerTrigger", 1).json(work + "/in")
         .writeStream.format("twophase-file").option("path", work + "/out").option("partitionBy", "grp")
         .option("checkpointLocation", work + "/ck").trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert spark.read.parquet(work + "/out").count() == 200
    spark.stop()
''')


def _java_version() -> str:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        return subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return ""


def archive_path() -> str:
    """Where the archive of this venv, JDK and PySpark lives."""
    import pyspark
    key = hashlib.sha256("\n".join([sys.prefix, pyspark.__version__, os.path.dirname(pyspark.__file__),
                                    _java_version()]).encode()).hexdigest()[:16]
    return os.path.join(ROOT, ".venv", "spark-cds", f"driver-{key}.jsa")


def submit_args(path: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` mapping the archive at ``path`` into the driver JVM, quietly."""
    opts = f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"
    return f"--driver-java-options {shlex.quote(opts)} pyspark-shell"


def build(path: str, timeout: float = 300) -> bool:
    """Run the training job with ``-XX:ArchiveClassesAtExit``; the archive appears at ``path`` only whole."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="building-", suffix=".jsa", dir=os.path.dirname(path))
    os.close(fd)
    os.unlink(tmp)  # the JVM creates it at exit
    env = dict(os.environ)
    env["PYSPARK_SUBMIT_ARGS"] = (f"--driver-java-options {shlex.quote(f'-XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off')}"
                                  " pyspark-shell")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYTHONPATH"] = pythonpath_with_root(env.get("PYTHONPATH", ""))
    try:
        run = subprocess.run([sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0 or not os.path.exists(tmp) or os.path.getsize(tmp) == 0:
            _log.warning("spark_cds_training_failed rc=%s stderr=%s", run.returncode, run.stderr[-1500:])
            return False
        os.replace(tmp, path)
        return True
    except (OSError, subprocess.SubprocessError) as e:
        _log.warning("spark_cds_training_failed error=%s", e)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def enable() -> Optional[str]:
    """Build the archive if missing and export ``PYSPARK_SUBMIT_ARGS`` for every Spark driver started from
    now on (this process and its children). Returns the archive's path, or None when off or unavailable.
    A ``PYSPARK_SUBMIT_ARGS`` already set is left alone."""
    if os.environ.get("TWOPHASE_SPARK_CDS") == "0" or os.environ.get("PYSPARK_SUBMIT_ARGS"):
        return None
    try:
        path = archive_path()
    except ImportError:
        return None
    if not os.path.exists(path) and not build(path):
        return None
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(path)
    return path
