"""delta-spark on the project's S3 server through Hadoop's S3A (``s3a://``), in ``.venv-delta``.

``scripts/setup_delta.sh`` fetches hadoop-aws at the Hadoop this PySpark bundles (and the AWS SDK modules S3A
loads) into ``.venv-delta/jvm/hadoop-aws-<version>/``; :func:`jars` finds them (None: not fetched). The settings
point S3A at a loopback radosgw (path-style, no TLS, static keys, and, as in ``integration/s3/s3a.py``, headers-only
signing with no optional checksums: radosgw refuses the SDK's signed aws-chunked payloads over plain HTTP).

Run as a script, it is the reader of ``test_delta_s3_oracle.py``: a SparkSession of its own (Delta's jars and
S3A's need a fresh JVM) reads a Delta table over ``s3a://`` and prints what it saw as one JSON line
(the endpoint and keys come from the environment: ``TWOPHASE_S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``)::

    python integration/delta_spark/s3a_delta.py s3a://bucket/table
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from integration.s3.s3a import s3a_settings  # noqa: E402  (the same S3A settings as the main venv's tests)


def hadoop_version() -> str:
    import pyspark
    found = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    return os.path.basename(found[0])[len("hadoop-client-api-"):-4] if found else ""


def jars() -> Optional[list[str]]:
    """hadoop-aws and the SDK modules for this PySpark's Hadoop, or None when not fetched."""
    d = os.path.join(sys.prefix, "jvm", f"hadoop-aws-{hadoop_version()}")
    if not os.path.exists(os.path.join(d, ".complete")):
        return None
    return sorted(glob.glob(os.path.join(d, "*.jar")))


def delta_jars() -> list[str]:
    d = os.path.join(sys.prefix, "jvm", f"delta-{importlib.metadata.version('delta-spark')}")
    return sorted(glob.glob(os.path.join(d, "*.jar")))


def spark_conf(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Spark settings for delta-spark with ``s3a://`` on ``endpoint`` (``http://host:port``)."""
    found = jars()
    if found is None:
        raise RuntimeError("hadoop-aws is not fetched for this venv: run `bash scripts/setup_delta.sh`")
    return {
        "spark.jars": ",".join(delta_jars() + found),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **s3a_settings(endpoint, access_key, secret_key),
    }


def session(app_name: str, endpoint: str, access_key: str, secret_key: str, master: str = "local[2]"):
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (SparkSession.builder.master(master).appName(app_name).config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC"))
    for k, v in spark_conf(endpoint, access_key, secret_key).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    table = sys.argv[1]
    spark = session("twophase-delta-s3a-reader", os.environ["TWOPHASE_S3_ENDPOINT"], os.environ["AWS_ACCESS_KEY_ID"],
                    os.environ["AWS_SECRET_ACCESS_KEY"])
    rows = spark.read.format("delta").load(table).collect()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    versions = sorted(r["version"] for r in history)
    out = {
        "rows": [r.asDict() for r in rows],
        "history": sorted(({"version": r["version"], "operation": r["operation"]} for r in history),
                          key=lambda h: h["version"]),
        "versions": {str(v): [r["id"] for r in spark.read.format("delta").option("versionAsOf", v).load(table)
                              .select("id").collect()] for v in versions},
        "partitionColumns": list(spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]["partitionColumns"]),
        "pruned": sorted(r["id"] for r in spark.read.format("delta").load(table).where("grp = 'g1'").collect()),
    }
    print("S3A-DELTA " + json.dumps(out))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
