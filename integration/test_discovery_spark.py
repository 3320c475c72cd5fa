"""A fresh SparkSession finds every twophase format by itself (PySpark's pyspark_* module lookup): no
``twophase.spark.register``. Run in a child process so that no other test's ``register`` can help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.spark

CHILD = textwrap.dedent('''
    import json, os, sys
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("discovery").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out, ck, src = sys.argv[1], sys.argv[2], sys.argv[3]
    spark.range(0, 500, numPartitions=2).selectExpr("id").write.json(src)
    q = (spark.readStream.format("json").schema("id bigint").load(src)
         .writeStream.format("twophase-file").option("path", out)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(240)
    kafka = (spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
             .option("subscribe", "t").load())
    print(json.dumps({"kafka_columns": kafka.columns,
                      "rows": spark.read.parquet(out).count() if os.path.exists(out) else 0,
                      "ids": spark.read.parquet(out).selectExpr("count(distinct id)").first()[0]}))
    spark.stop()
''')


def test_fresh_session_finds_twophase_formats_without_register(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "out"), str(tmp_path / "ck"), str(tmp_path / "in")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["kafka_columns"][:2] == ["key", "value"]
    assert got["rows"] == got["ids"] == 500  # every input record once
