"""The crash chain of the two sinks on Azure Blob (Azurite) on real Spark: twophase-file on an ``abfss://``
path (block blobs committed by the driver) and twophase-delta on an ``abfss://`` table.

The job is SIGKILLed (whole session) at each point of the chain in turn (``integration.crash_chain``;
every protocol point with ``TWOPHASE_FULL_MATRIX=1``), each restart recovering the previous crash, then
runs clean. Afterwards every input row is committed exactly once, nothing of this sink is left staged
(no name with only staged blocks; for Delta no data blob the table does not reference), and every
checkpoint of the transaction log is final. As on S3, files are committed one by one, so only a crash at
``mid_commit`` may show part of a batch of files until the next start's recovery commits the rest;
Delta commits a whole batch at once.
"""

from __future__ import annotations

import io
import urllib.parse

import pyarrow.parquet as pq
import pytest

from _support import assert_exactly_once, crash_chain
from integration.azure.azurite import AzureServer

pytestmark = [pytest.mark.spark, pytest.mark.azure, pytest.mark.slow]


def file_ids(server: AzureServer, container: str) -> list[int]:
    c = server.service().get_container_client(container)
    ids: list[int] = []
    for name in server.blob_names(container, "out", uncommitted=False):
        if name.endswith(".parquet") and not name.startswith("_twophase/"):
            ids += pq.read_table(io.BytesIO(c.download_blob(f"out/{name}").readall())).column("id").to_pylist()
    return ids


def delta_ids(server: AzureServer, uri: str) -> list[int]:
    from deltalake import DeltaTable
    try:
        return DeltaTable(uri, storage_options=server.storage_options()).to_pyarrow_table().column("id").to_pylist()
    except Exception as e:  # no table yet: nothing committed
        if "no files in log segment" in str(e).lower() or "not a delta table" in str(e).lower():
            return []
        raise


def final_states(sink) -> set[str]:  # noqa: ANN001 - any twophase sink
    return {r.state.value for r in sink.transaction_log().records()}


@pytest.mark.parametrize("fmt", ["twophase-file", "twophase-delta"])
def test_azure_sinks_crash_chain_then_exactly_once(azure_server: AzureServer, tmp_path, fmt: str) -> None:
    container = azure_server.new_container()
    prefix = "out" if fmt == "twophase-file" else "table"
    uri = azure_server.url(container, prefix)
    options = {"path": uri, "partitionBy": "p", **azure_server.options()}

    def committed() -> list[int]:
        return file_ids(azure_server, container) if fmt == "twophase-file" else delta_ids(azure_server, uri)

    def no_duplicates_so_far(point: str) -> None:
        got = committed()
        assert len(got) == len(set(got)), f"duplicates after crash at {point}"
        if fmt == "twophase-delta" or point != "mid_commit":  # files commit one by one: mid_commit shows part
            assert len(got) % 40 == 0, f"a partial batch is visible after crash at {point}: {len(got)} rows"

    ids, _ = crash_chain(fmt, tmp_path, options, check_partial=no_duplicates_so_far)
    assert_exactly_once(committed(), ids)

    staged = azure_server.blob_names(container, prefix, uncommitted=True) - \
        azure_server.blob_names(container, prefix, uncommitted=False)
    assert not [n for n in staged if n.rsplit("/", 1)[-1].startswith("part-")], f"staged blocks left: {sorted(staged)}"
    if fmt == "twophase-file":
        from twophase.sinks.files import file_sink_from_options
        sink = file_sink_from_options(options)
    else:
        import pyarrow as pa
        from deltalake import DeltaTable
        from twophase.sinks.delta import DeltaSink
        sink = DeltaSink.from_options(options)
        dt = DeltaTable(uri, storage_options=azure_server.storage_options())
        referenced = {urllib.parse.unquote(p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}
        data = {n for n in azure_server.blob_names(container, prefix, uncommitted=False)
                if n.endswith(".parquet") and not n.startswith(("_delta_log/", "_twophase/"))}
        assert data == referenced, f"data blobs the table does not reference: {sorted(data - referenced)}"
    states = final_states(sink)
    assert states and states <= {"COMMITTED", "ABORTED"}, states
