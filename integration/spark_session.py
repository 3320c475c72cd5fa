"""One SparkSession per test module, configured for this machine (local[2], no UI, venv Python)."""

from __future__ import annotations

import os
import sys
from typing import Any


def make_spark(app: str = "twophase-tests", cores: int = 2, conf: dict[str, str] | None = None) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    import twophase.spark

    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "3")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.spark.register(spark)
    return spark
