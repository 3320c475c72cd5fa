"""twophase from a Spark Connect client: the server is ``sbin/start-connect-server.sh`` of the PySpark
distribution, the client a separate process with only a ``sc://`` URL. The formats are found on the server
(PySpark's discovery modules, no register()); ``foreach_batch`` runs in the server's foreachBatch worker (no
``df.rdd``, which Connect does not have); a batch write (``df.write``) runs twice with one writeId. Every
input record must land once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.spark

CLIENT = textwrap.dedent('''
    import json, sys
    from pyspark.sql import SparkSession
    url, inp, out1, ck1, out2, ck2 = sys.argv[1:7]
    spark = SparkSession.builder.remote(url).getOrCreate()
    assert spark.__class__.__module__.startswith("pyspark.sql.connect"), spark.__class__
    spark.range(0, 300, numPartitions=3).selectExpr("id", "id % 3 AS grp").write.json(inp)
    src = spark.readStream.format("json").schema("id bigint, grp bigint").load(inp)
    q = (src.writeStream.format("twophase-file").option("path", out1).option("partitionBy", "grp")
         .option("checkpointLocation", ck1).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    from twophase.sinks.files import FileSink
    from twophase.spark import foreach_batch
    sink = FileSink.from_options({"path": out2})
    q = (src.writeStream.foreachBatch(foreach_batch(sink, owner=ck2)).option("checkpointLocation", ck2)
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    kafka = spark.readStream.format("twophase-kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option(
        "subscribe", "t").load()
    out3 = out2 + "-batch"
    for _ in range(2):  # a batch write; its re-run with the same writeId writes nothing
        spark.range(0, 300, numPartitions=3).write.format("twophase-file").mode("append").option(
            "writeId", "connect-1").save(out3)
    ids1 = [r["id"] for r in spark.read.parquet(out1).select("id").collect()]
    ids2 = [r["id"] for r in spark.read.parquet(out2).select("id").collect()]
    ids3 = [r["id"] for r in spark.read.parquet(out3).select("id").collect()]
    print(json.dumps({"ids1": sorted(ids1), "ids2": sorted(ids2), "ids3": sorted(ids3), "kafka": kafka.columns[:2]}))
    spark.stop()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark[connect] (grpcio)")
    import pyspark
    home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    logs = tmp_path_factory.mktemp("connect")
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(logs),
           "SPARK_PID_DIR": str(logs), "SPARK_IDENT_STRING": f"twophase{port}"}
    server = subprocess.Popen(["bash", os.path.join(home, "sbin", "start-connect-server.sh"), "--wait",
                               "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
                               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"],
                              env=env, stdout=open(logs / "server.out", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the Spark Connect server exited: {(logs / 'server.out').read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        os.killpg(server.pid, signal.SIGKILL)
        pytest.fail("the Spark Connect server did not listen within 180 s")
    yield f"sc://127.0.0.1:{port}"
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def test_spark_connect_client_format_and_foreach_batch_exactly_once(connect_url, tmp_path):
    args = [str(tmp_path / n) for n in ("in", "out1", "ck1", "out2", "ck2")]
    res = subprocess.run([sys.executable, "-c", CLIENT, connect_url, *args], capture_output=True, text=True,
                         timeout=900, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ids1"] == list(range(300)) and got["ids2"] == list(range(300))
    assert got["ids3"] == list(range(300))  # df.write from a Connect client, once
    assert got["kafka"] == ["key", "value"]
