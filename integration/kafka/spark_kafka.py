"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) as a real client and as the peer.

``scripts/spark_kafka.sh fetch`` (called by setup.sh) resolves it with mvn into ``.venv/jvm/spark-kafka/``:
the connector, spark-token-provider-kafka, kafka-clients and commons-pool2 (what PySpark does not bundle).
Maven Central does not serve 4.3.0 (PySpark's version) yet, so the jars are 4.2.0's; they run on PySpark 4.3.

``spark.jars`` is read when a SparkContext starts, so :func:`spark_with_kafka_connector` starts a context of
its own (``integration.spark_session.own_spark``: the shared one is stopped first, the next ``make_spark``
starts a new one); the caller stops it. Never Ivy / ``spark.jars.packages``.
"""

from __future__ import annotations

import glob
import os
import subprocess
from typing import Any

from integration.spark_session import ROOT, own_spark

JARS_DIR = os.path.join(ROOT, ".venv", "jvm", "spark-kafka")


def connector_jars(fetch: bool = True) -> list[str]:
    """The jars of Spark's Kafka connector (fetched with scripts/spark_kafka.sh if missing and ``fetch``)."""
    if fetch and not os.path.exists(os.path.join(JARS_DIR, ".complete")):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "spark_kafka.sh"), "fetch"], check=True)
    jars = sorted(glob.glob(os.path.join(JARS_DIR, "*.jar")))
    if not any(os.path.basename(j).startswith("spark-sql-kafka-0-10") for j in jars):
        raise FileNotFoundError(f"Spark's Kafka connector is not in {JARS_DIR}: run scripts/spark_kafka.sh fetch")
    return jars


def connector_version() -> str:
    """The connector's version (from its jar name), e.g. ``4.2.0``."""
    jar = next(j for j in connector_jars() if os.path.basename(j).startswith("spark-sql-kafka-0-10"))
    return os.path.basename(jar)[:-len(".jar")].rsplit("-", 1)[1]


def spark_with_kafka_connector(app: str = "twophase-spark-kafka", cores: int = 2,
                               conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on a local[cores] context of its own with Spark's Kafka connector on ``spark.jars`` and
    twophase's formats registered. The caller stops it."""
    from pyspark.sql import SparkSession
    import twophase.spark

    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.jars", ",".join(connector_jars()))
               .config("spark.sql.shuffle.partitions", "3")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = own_spark(builder)
    twophase.spark.register(spark)
    return spark
