"""delta-spark on Azurite through Hadoop's ABFS driver (``abfs://``) in its Blob-endpoint mode, in ``.venv-delta``.

``scripts/hadoop_azure.sh`` (run by ``scripts/setup_delta.sh``) fetches hadoop-azure at the Hadoop this PySpark
bundles into ``.venv-delta/jvm/hadoop-azure-<version>/``; :func:`jars` finds them (None: not fetched).

Hadoop 3.5's WASB driver (``wasb://``) is a stub that refuses every call ("no longer supported ... use ABFS"), and
Azurite has no DFS endpoint, so the reader uses ABFS over the Blob endpoint (the FNS mode of Hadoop 3.5's
hadoop-azure) with these settings (:func:`abfs_settings`):

- ``fs.azure.abfs.endpoint=127.0.0.1:PORT``: requests go to ``http://127.0.0.1:PORT/<account>/<container>``,
  Azurite's path-style URLs (the account is the first label of the URL's host);
- ``fs.azure.account.hns.enabled=false`` and ``fs.azure.fns.account.service.type=BLOB``: the Blob REST API, no
  namespace probe on the DFS endpoint;
- ``fs.azure.always.use.https=false`` with the ``abfs://`` scheme: plain HTTP;
- ``fs.azure.networking.library=JDK_HTTP_URL_CONNECTION``: the default Apache client fails to start over plain
  HTTP ("SSL socket factory may not be null", hadoop-azure 3.5.0);
- Shared Key with Azurite's development account.

Run as a script, it is the reader of ``test_delta_azure_oracle.py``: a SparkSession of its own (ABFS's jars need a
fresh JVM) reads the Delta table and prints what it saw as one JSON line. The endpoint, account and key come from
the environment (``TWOPHASE_AZURE_ENDPOINT``, ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``), the
table URL and the sink id from the command line::

    python integration/delta_spark/abfs_delta.py abfs://container@devstoreaccount1.dfs.core.windows.net/table SINK_ID
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any, Optional
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3a_delta import delta_jars, hadoop_version  # noqa: E402

DFS_HOST = "dfs.core.windows.net"


def jars() -> Optional[list[str]]:
    """hadoop-azure (and the two jars it needs that PySpark lacks) for this PySpark's Hadoop; None: not fetched."""
    d = os.path.join(sys.prefix, "jvm", f"hadoop-azure-{hadoop_version()}")
    if not os.path.exists(os.path.join(d, ".complete")):
        return None
    return sorted(glob.glob(os.path.join(d, "*.jar")))


def table_url(container: str, account: str, path: str) -> str:
    """The ``abfs://`` URL of ``path`` in ``container`` (plain HTTP, as Azurite serves)."""
    return f"abfs://{container}@{account}.{DFS_HOST}/{path}"


def abfs_settings(endpoint: str, account: str, key: str) -> dict[str, str]:
    """Hadoop settings (``spark.hadoop.``-prefixed) for ``abfs://`` on Azurite's Blob endpoint
    (``http://host:port/<account>``, path-style)."""
    u = urlsplit(endpoint)
    if u.scheme != "http" or not u.port or u.path.strip("/") != account:
        raise ValueError(f"not an Azurite-style endpoint (http://host:port/{account}): {endpoint}")
    settings = {
        "fs.azure.abfs.endpoint": f"{u.hostname}:{u.port}",
        "fs.azure.always.use.https": "false",
        "fs.azure.account.hns.enabled": "false",
        "fs.azure.fns.account.service.type": "BLOB",
        "fs.azure.networking.library": "JDK_HTTP_URL_CONNECTION",
        "fs.azure.account.auth.type": "SharedKey",
        f"fs.azure.account.key.{account}.{DFS_HOST}": key,
    }
    return {"spark.hadoop." + k: v for k, v in settings.items()}


def session(app_name: str, endpoint: str, account: str, key: str, master: str = "local[2]") -> Any:
    from pyspark.sql import SparkSession
    found = jars()
    if found is None:
        raise RuntimeError("hadoop-azure is not fetched for this venv: run `bash scripts/hadoop_azure.sh fetch`")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (SparkSession.builder.master(master).appName(app_name).config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.adaptive.enabled", "false")  # the executed plan is the one that ran (numFiles)
         .config("spark.databricks.delta.snapshotPartitions", "2")  # a small log: 2 tasks, not 50, per snapshot
         .config("spark.jars", ",".join(delta_jars() + found))
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    for k, v in abfs_settings(endpoint, account, key).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def files_scanned(df: Any) -> tuple[int, int]:
    """(rows, files read) of ``df``: the rows collected and the file scan's ``numFiles`` metric."""
    rows = len(df.collect())
    leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
    n = 0
    for i in range(leaves.size()):
        metrics = leaves.apply(i).metrics()
        if metrics.contains("numFiles"):
            n += metrics.apply("numFiles").value()
    return rows, n


def main() -> int:
    table, sink_id = sys.argv[1], sys.argv[2]
    spark = session("twophase-delta-abfs-reader", os.environ["TWOPHASE_AZURE_ENDPOINT"],
                    os.environ["AZURE_STORAGE_ACCOUNT_NAME"], os.environ["AZURE_STORAGE_ACCOUNT_KEY"])

    def delta(**options: Any) -> Any:
        r = spark.read.format("delta")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load(table)

    def history() -> list[dict[str, Any]]:
        return sorted(({"version": r["version"], "operation": r["operation"]}
                       for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()), key=lambda h: h["version"])

    df = delta()
    h = history()
    last = h[-1]["version"]
    _, all_files = files_scanned(delta(versionAsOf=last))
    out: dict[str, Any] = {
        "schema": [[f.name, f.dataType.simpleString(), f.nullable] for f in df.schema.fields],
        "rows": [r.asDict() for r in df.collect()],
        "history": h,
        "versions": {str(v["version"]): [r["id"] for r in delta(versionAsOf=v["version"]).select("id").collect()]
                     for v in h},
        "partitionColumns": list(spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]["partitionColumns"]),
        "pruned": sorted(r["id"] for r in delta().where("grp = 'g1'").collect()),
        "files": {"all": all_files},
    }
    for name, cond in (("id_ge_100", "id >= 100"), ("payload_row_17", "payload = 'row-17'")):
        rows, files = files_scanned(delta(versionAsOf=last).where(cond))
        out["files"][name] = [rows, files]
    # the sink's app transaction as Delta reads it: Delta's own idempotent writer (txnAppId / txnVersion) skips a
    # batch version twophase committed under the sink id, and commits the next one (a write through ABFS)
    extra = spark.range(1000, 1001).selectExpr("id", "'g9' as grp", "'x' as payload")
    last_batch = sum(1 for v in h if v["operation"] == "WRITE") - 1  # Spark's batch ids start at 0
    txn = []
    for version in (last_batch, last_batch + 1):
        (extra.write.format("delta").mode("append").option("txnAppId", sink_id).option("txnVersion", version)
         .save(table))
        txn.append([version, len(history())])
    out["txn"] = txn
    out["after_txn_rows"] = delta().count()
    print("ABFS-DELTA " + json.dumps(out))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
