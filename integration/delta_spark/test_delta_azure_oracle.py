"""Delta's own engine judges a twophase-delta table on Azure Blob Storage (issue 24, the oracle on Azurite).

A twophase-delta streaming query (``format("twophase-delta")``, three micro-batches, partitioned by ``grp``, sink id
``azure-oracle-sink``) writes ``abfss://<container>@devstoreaccount1.dfs.core.windows.net/table`` on Azurite
(``scripts/azurite.sh``); delta-spark then reads it over ``abfs://`` (Hadoop's ABFS driver in its Blob-endpoint mode,
hadoop-azure at the Hadoop PySpark 4.2 bundles, fetched by ``scripts/hadoop_azure.sh``) in a Spark of its own
(``abfs_delta.py``: ABFS's jars need a fresh JVM). It checks the schema (names, types) and the rows, the partition
column and pruning, ``DESCRIBE HISTORY`` with one WRITE per batch, time travel to every version (each adding one
whole batch), data skipping (a filter on ``id`` or ``payload`` scans fewer files), and the sink's app transaction
as Delta's own idempotent writer reads it (``txnAppId``: the last batch id is skipped, the next one committed).
Skipped when hadoop-azure is not fetched for this venv, or when ``TWOPHASE_AZURE_ENDPOINT`` names a server that is
not Azurite-style (``http://host:port/<account>``; the reader's settings are the emulator's).
"""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import urlsplit

import pytest

from integration.fileio import INPUT_SCHEMA, ROOT, make_input
from integration.jobrun import job_env, run_in_own_session

import abfs_delta

pytestmark = [pytest.mark.spark, pytest.mark.azure,
              pytest.mark.skipif(abfs_delta.jars() is None, reason="hadoop-azure not fetched for .venv-delta "
                                 "(bash scripts/hadoop_azure.sh fetch) or its PySpark bundles another Hadoop than "
                                 "scripts/jvm/hadoop-azure/pom.xml pins")]

READER = os.path.join(ROOT, "integration", "delta_spark", "abfs_delta.py")
ROWS = 50
BATCHES = 3
SINK_ID = "azure-oracle-sink"


def test_delta_azure_oracle_delta_spark_reads_twophase_delta_table_over_abfs(spark, azure_server, tmp_path):
    u = urlsplit(azure_server.endpoint)
    if u.scheme != "http" or u.path.strip("/") != azure_server.account:
        pytest.skip(f"the ABFS reader's settings are Azurite's (http://host:port/<account>), not {azure_server.kind}")
    container = azure_server.new_container()
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, BATCHES, ROWS)
    w = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp)
         .writeStream.format("twophase-delta").option("path", azure_server.url(container, "table"))
         .option("checkpointLocation", ck).option("partitionBy", "grp").option("sink.id", SINK_ID))
    for k, v in azure_server.options().items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(240), "the twophase-delta query did not finish"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()

    env = job_env()
    env.update({"TWOPHASE_AZURE_ENDPOINT": azure_server.endpoint, "AZURE_STORAGE_ACCOUNT_NAME": azure_server.account,
                "AZURE_STORAGE_ACCOUNT_KEY": azure_server.key})
    url = abfs_delta.table_url(container, azure_server.account, "table")
    run = run_in_own_session([sys.executable, READER, url, SINK_ID], env=env, timeout=240, capture=True)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("ABFS-DELTA ")]
    assert run.returncode == 0 and lines, f"the delta-spark reader failed (rc={run.returncode}):\n{run.stderr[-4000:]}"
    seen = json.loads(lines[-1][len("ABFS-DELTA "):])

    # rows and types: the input's schema (the sink's columns, nullable as Spark's file source reads them)
    assert seen["schema"] == [["id", "bigint", True], ["grp", "string", True], ["payload", "string", True]]
    got = sorted((r["id"], r["grp"], r["payload"]) for r in seen["rows"])
    assert got == sorted((i, f"g{i % 3}", f"row-{i}") for i in ids), "rows differ"
    # partition values: the column, and pruning to one partition returns exactly its rows
    assert seen["partitionColumns"] == ["grp"]
    assert seen["pruned"] == sorted(i for i in ids if i % 3 == 1)
    # one commit per batch after the table's creation
    h = seen["history"]
    assert [x["operation"] for x in h] == ["CREATE TABLE"] + ["WRITE"] * BATCHES, h
    assert [x["version"] for x in h] == list(range(BATCHES + 1))
    # time travel: version 0 is empty, each later version adds one whole input file (one batch), no row twice
    before: set[int] = set()
    for v in range(BATCHES + 1):
        at = seen["versions"][str(v)]
        assert len(at) == len(set(at)) and before <= set(at), f"version {v}"
        added = set(at) - before
        assert (v == 0 and not added) or (len(added) == ROWS and len({i // ROWS for i in added}) == 1), f"version {v}"
        before = set(at)
    assert before == set(ids)
    # data skipping on twophase's statistics: the last batch's ids, one payload value
    files = seen["files"]
    assert files["id_ge_100"][0] == ROWS and 0 < files["id_ge_100"][1] < files["all"], files
    assert files["payload_row_17"][0] == 1 and 0 < files["payload_row_17"][1] < files["all"], files
    # the app transaction (sink id, last batch id) as Delta's idempotent writer reads it: skipped, the next committed
    assert seen["txn"] == [[BATCHES - 1, BATCHES + 1], [BATCHES, BATCHES + 2]], seen["txn"]
    assert seen["after_txn_rows"] == len(ids) + 1
