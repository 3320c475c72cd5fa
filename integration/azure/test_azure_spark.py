"""twophase-delta on real Spark with its table on Azure Blob (Azurite): ``writeStream`` to an ``abfss://``
path, the executors staging blocks and the driver committing, read back exactly once; a restart with more
input appends only the new rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from _support import write_input
from integration.azure.azurite import AzureServer

pytestmark = [pytest.mark.spark, pytest.mark.azure]


def stream_all(spark: Any, tmp_path: Path, fmt: str, uri: str, options: dict[str, str]) -> None:
    """One run of the query (input ``tmp_path/in``, a file per batch, checkpoint ``tmp_path/ck``) to ``fmt`` at
    ``uri``, partitioned by ``p``, until every input file is written; a second call is a restart."""
    df = spark.readStream.schema("id long, p string, v double").option("maxFilesPerTrigger", 1) \
        .json(str(tmp_path / "in"))
    q = (df.writeStream.format(fmt).option("path", uri).option("partitionBy", "p").options(**options)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None, q.exception()


def test_delta_spark_stream_to_abfss_on_azurite_exactly_once(azure_server: AzureServer, container: str,
                                                             tmp_path: Path) -> None:
    from integration.spark_session import make_spark
    spark = make_spark(f"twophase-{__name__}")
    uri = azure_server.url(container, "table")
    ids = write_input(tmp_path / "in", 2, 20)

    stream_all(spark, tmp_path, "twophase-delta", uri, azure_server.options())
    ids += write_input(tmp_path / "in", 1, 20, first=2)
    stream_all(spark, tmp_path, "twophase-delta", uri, azure_server.options())  # a restart: only the new rows
    dt = DeltaTable(uri, storage_options=azure_server.storage_options())
    got = dt.to_pyarrow_table().column("id").to_pylist()
    assert sorted(got) == sorted(ids) and len(got) == len(set(got))
    assert dt.transaction_version(f"delta:{uri}") == 2  # one micro-batch per input file, batch ids 0..2
    assert len([h for h in dt.history() if h.get("operation") == "WRITE"]) == 3


def test_file_spark_stream_to_abfss_on_azurite_exactly_once(azure_server: AzureServer, container: str,
                                                            tmp_path: Path) -> None:
    """format twophase-file with an abfss:// path: the executors stage blocks, the driver's commit makes the
    blobs; a restart with one more input file appends only its rows; every row once, no staged blocks left."""
    import io
    import pyarrow.parquet as pq
    from integration.spark_session import make_spark
    spark = make_spark(f"twophase-{__name__}")
    uri = azure_server.url(container, "files")
    ids = write_input(tmp_path / "in", 2, 20)

    stream_all(spark, tmp_path, "twophase-file", uri, azure_server.options())
    ids += write_input(tmp_path / "in", 1, 20, first=2)
    stream_all(spark, tmp_path, "twophase-file", uri, azure_server.options())
    c = azure_server.service().get_container_client(container)
    committed = [b.name for b in c.list_blobs(name_starts_with="files/") if b.name.rsplit("/", 1)[-1].startswith("part-")]
    staged = {b.name for b in c.list_blobs(name_starts_with="files/", include=["uncommittedblobs"])
              if b.name.rsplit("/", 1)[-1].startswith("part-")}
    assert staged == set(committed), "staged blocks left"
    got: list[int] = []
    for name in committed:
        assert name.split("/")[1] in ("p=even", "p=odd")
        got += pq.read_table(io.BytesIO(c.get_blob_client(name).download_blob().readall())).column("id").to_pylist()
    assert sorted(got) == sorted(ids) and len(got) == len(set(got))
