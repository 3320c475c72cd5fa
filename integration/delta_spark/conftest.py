"""Delta Lake's own engine (delta-spark) as the oracle of twophase-delta's tables.

These tests run in the second environment ``.venv-delta`` (``scripts/setup_delta.sh``: PySpark 4.2 with
delta-spark 4.4 and Delta's jars under ``.venv-delta/jvm/``), as ``scripts/test.sh``'s second pytest run.
In any other environment (the main ``.venv``: PySpark 4.3, which no Delta release supports yet) the folder is
not collected. One SparkSession for the whole run, with Delta's jars through ``spark.jars`` (never Ivy).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if importlib.util.find_spec("delta") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # the class-data-sharing archive (integration/spark_cds.py) would cost a training run for this venv: one
    # session here does not pay for it
    os.environ.setdefault("TWOPHASE_SPARK_CDS", "0")


def delta_jars() -> list[str]:
    """Delta's jars of the installed delta-spark version (``.venv-delta/jvm/delta-<version>/``)."""
    import importlib.metadata
    version = importlib.metadata.version("delta-spark")
    folder = os.path.join(sys.prefix, "jvm", f"delta-{version}")
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not jars:
        pytest.fail(f"no Delta jars in {folder}: run scripts/setup_delta.sh")
    return jars


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession with Delta's SQL extension and catalog, twophase's formats registered."""
    from pyspark.sql import SparkSession
    import twophase.spark
    from integration.spark_session import pythonpath_with_root
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = pythonpath_with_root(os.environ.get("PYTHONPATH", ""))
    session = (SparkSession.builder.master("local[2]").appName("twophase-delta-oracle")
               .config("spark.jars", ",".join(delta_jars()))
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .getOrCreate())
    twophase.spark.register(session)
    yield session
    session.stop()
