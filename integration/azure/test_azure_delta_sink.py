"""twophase-delta with its table on Azure Blob Storage (Azurite), driven without Spark: what the
conformance suite (``integration/test_conformance.py``, ``delta-azure``) does not show of Azure's two
phases (staged blocks, Put Block List, the sweeps of staged blocks), a crash between prepare_commit and
commit, two writers committing to one table at once, and the refusals of bad options."""

from __future__ import annotations

import threading
import uuid
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from integration.azure.azurite import AzureServer, claimed_coordinator
from integration.azure.commit_job import SCHEMA, expected_ids, rows, run_clean_then_crash, run_commit_job, assert_done
from twophase.errors import ConfigurationError
from twophase.naming import own_part_checkpoint
from twophase.sink import CommitStatus, TransactionContext, run_task, sink_token
from twophase.sinks.delta import DeltaSink
from twophase.states import CheckpointState

pytestmark = [pytest.mark.azure]



def make_sink(server: AzureServer, container: str, **extra: str) -> DeltaSink:
    sink = DeltaSink.from_options({"path": server.url(container, "table"), "partitionBy": "p", **server.options(),
                                   **extra}, SCHEMA)
    sink.validate_destination()
    return sink


coordinator = claimed_coordinator


def table_ids(server: AzureServer, uri: str) -> list[int]:
    return sorted(DeltaTable(uri, storage_options=server.storage_options()).to_pyarrow_table().column("id").to_pylist())


def blobs(server: AzureServer, container: str, *, uncommitted: bool) -> set[str]:
    """Data blob names of the table ('table/' stripped), with names that have only staged blocks if asked."""
    return {n for n in server.blob_names(container, "table", uncommitted=uncommitted) if n.endswith(".parquet")}


def referenced(server: AzureServer, uri: str) -> set[str]:
    dt = DeltaTable(uri, storage_options=server.storage_options())
    out: set[str] = set()
    for v in range(dt.version() + 1):  # every file any version added
        t = DeltaTable(uri, version=v, storage_options=server.storage_options())
        out |= {urllib.parse.unquote(p) for p in pa.table(t.get_add_actions(flatten=True)).column("path").to_pylist()}
    return out


def test_delta_sink_inv1_azure_blocks_are_staged_unseen_then_one_commit_shows_every_row(azure_server: AzureServer,
                                                                                        container: str) -> None:
    """A data file is staged blocks (three, with a 5 MiB block size) that no listing shows until its block
    list is committed (prepare_commit); then the blob has those bytes. Rows are invisible until the Delta
    commit, then all there; a second commit of the checkpoint is ALREADY_COMMITTED and writes no second
    copy (invariant 2)."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    sink = make_sink(azure_server, container, partSize="5m")
    data = os.urandom(12 << 20)
    rel = f"p=x/part-{sink_token(sink.sink_id)}-00000009-00000-0123456789ab-000.parquet"
    with ThreadPoolExecutor(2) as pool:
        stream = sink.files.open(rel, pool)
        stream.write(data[:6 << 20])
        stream.write(data[6 << 20:])
        for f in stream._futures:
            f.result()
        assert blobs(azure_server, container, uncommitted=False) == set(), "staged blocks are visible"
        assert blobs(azure_server, container, uncommitted=True) == {rel}
        assert sink.files.exists(rel) is False
        assert sink.files.finish(stream) == len(data)
    blob = azure_server.service().get_blob_client(container, f"table/{rel}")
    assert len(blob.get_block_list("committed")[0]) == 3 and blob.download_blob().readall() == data
    sink.files.delete(rel)

    coord = coordinator(sink)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows(0, t)]) for t in range(2)]
    assert blobs(azure_server, container, uncommitted=False) == {f["rel"] for a in acks for f in a.handle["files"]}
    assert DeltaTable(sink.uri, storage_options=azure_server.storage_options()).to_pyarrow_table().num_rows == 0
    assert coord.complete_batch(0, acks) == "COMMITTED"
    assert table_ids(azure_server, sink.uri) == expected_ids(range(1))
    committer = sink.create_committer()
    results = committer.commit_checkpoint(0, [committer.decode(a.handle) for a in acks])
    assert {r.status for r in results} == {CommitStatus.ALREADY_COMMITTED}
    coord.complete_batch(0, [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])])
    assert table_ids(azure_server, sink.uri) == expected_ids(range(1)), "a re-commit wrote a second copy"
    assert blobs(azure_server, container, uncommitted=True) == referenced(azure_server, sink.uri)


def test_delta_sink_inv4_azure_sweep_drops_own_losers_staged_blocks_and_never_another_sinks(
        azure_server: AzureServer, container: str) -> None:
    """Checkpoint 1 of sink A: one attempt died with blocks staged, one pre-committed (a committed blob)
    but its ack was lost, the third won. Sink B (another sink.id: another token) shares the table, with a
    pre-committed file and staged blocks of two attempts. Right after A's commit (its sweep; no later
    batch): no blob or staged block of A's losers is left; every name of B is there, B then commits its
    file, and B's own sweep drops its staged blocks."""
    a = make_sink(azure_server, container, **{"sink.id": "a"}, partSize="5m")
    b = make_sink(azure_server, container, **{"sink.id": "b"}, partSize="5m")
    coord_a, coord_b = coordinator(a, "qa"), coordinator(b, "qb")
    coord_a.complete_batch(0, [run_task(a, TransactionContext(a.sink_id, 0, "0"), [rows(0, 0)])])
    crashed = stage_blocks(a, 1, "p=even")  # an attempt died while uploading: blocks staged, never committed
    lost = run_task(a, TransactionContext(a.sink_id, 1, "0"), [rows(1, 0)])  # committed blobs, ack lost
    won = run_task(a, TransactionContext(a.sink_id, 1, "0"), [rows(1, 0)])
    b_ack = run_task(b, TransactionContext(b.sink_id, 1, "0"), [rows(1, 1)])
    b_staging = stage_blocks(b, 1, "p=odd")  # B's checkpoint 1, another attempt still uploading
    b_old = stage_blocks(b, 1, "")  # and one more of its attempts, at the root
    before = blobs(azure_server, container, uncommitted=True)
    committed_before = blobs(azure_server, container, uncommitted=False)
    tok_a, tok_b = sink_token(a.sink_id), sink_token(b.sink_id)
    assert tok_a != tok_b
    assert any(tok_a in n and n not in committed_before for n in before), "A's crashed attempt staged blocks"
    assert any(tok_b in n and n not in committed_before for n in before), "B's writer staged blocks"
    assert coord_a.complete_batch(1, [won]) == "COMMITTED"
    after = blobs(azure_server, container, uncommitted=True)
    own_after = {n for n in after if own_part_checkpoint(n.rsplit("/", 1)[-1], a.sink_id) is not None}
    assert own_after == referenced(azure_server, a.uri) & own_after, f"A's losers left: {sorted(own_after - referenced(azure_server, a.uri))}"
    assert not {f["rel"] for f in lost.handle["files"]} & after
    assert crashed not in after
    assert {n for n in before if tok_b in n} <= after, "another sink's blob or staged blocks were swept"
    coord_b.complete_batch(1, [b_ack])  # B commits its pre-committed file: nothing of it was swept
    assert table_ids(azure_server, a.uri) == sorted([*rows(0, 0).column("id").to_pylist(), *rows(1, 0).column("id").to_pylist(),
                                                     *rows(1, 1).column("id").to_pylist()])
    left = blobs(azure_server, container, uncommitted=True) - referenced(azure_server, a.uri)
    assert left == set(), f"B's own sweep left its staged blocks: {sorted(left)}"
    assert {b_staging, b_old}.isdisjoint(left)


def stage_blocks(sink: DeltaSink, cid: int, part_rel: str) -> str:
    """Stage one 5 MiB block of a data file of ``sink``'s checkpoint ``cid`` (own name, a new attempt) and
    abandon it, as an attempt that died mid-upload does; returns its name."""
    from concurrent.futures import ThreadPoolExecutor
    from twophase.naming import part_file_name
    name = part_file_name(sink.sink_id, cid, "0", uuid.uuid4().hex[:12], 0, "parquet")
    rel = f"{part_rel}/{name}" if part_rel else name
    with ThreadPoolExecutor(1) as pool:
        stream = sink.files.open(rel, pool)
        stream.write(b"x" * ((5 << 20) + 1))
        for f in stream._futures:
            f.result()
    return rel


@pytest.mark.parametrize("point", ["after_complete", "mid_commit"])
def test_delta_sink_inv2_azure_crash_between_prepare_commit_and_commit_recovers_exactly_once(
        azure_server: AzureServer, container: str, tmp_path: Path, point: str) -> None:
    """The driver is SIGKILLed after checkpoint 1's decision is durable (after_complete: before the Delta
    commit; mid_commit: after it, before COMMITTED is recorded). The next run recovers it, re-runs batch 1
    (as Spark does after a restart) and writes batch 2: every row once, no blob or staged block left
    that no Delta version references, every log record final."""
    options = {"path": azure_server.url(container, "table"), "partitionBy": "p", **azure_server.options()}

    run_clean_then_crash(options, tmp_path, point)
    uri = DeltaSink.from_options(options, SCHEMA).uri
    got = table_ids(azure_server, uri)
    assert got == (expected_ids(range(2)) if point == "mid_commit" else expected_ids(range(1))), "a partial batch"
    for cid in (1, 2):  # the restart: recovery, the re-run of batch 1, then batch 2
        assert_done(run_commit_job(options, cid))
    assert table_ids(azure_server, uri) == expected_ids(range(3))
    sink = DeltaSink.from_options(options, SCHEMA)
    dt = DeltaTable(uri, storage_options=azure_server.storage_options())
    assert dt.transaction_version(sink.sink_id) == 2
    assert len([h for h in dt.history() if h.get("operation") == "WRITE"]) == 3, "one Delta commit per batch"
    assert blobs(azure_server, container, uncommitted=True) == referenced(azure_server, uri), "leftovers"
    states = {r.state for r in sink.transaction_log().records()}
    assert states <= {CheckpointState.COMMITTED, CheckpointState.ABORTED}, states


def test_delta_sink_inv1_azure_two_writers_committing_at_once_lose_no_commit(azure_server: AzureServer,
                                                                            container: str) -> None:
    """Two queries (two sink ids) append to one table at the same moments, 6 checkpoints each: delta-rs's
    conditional create of each _delta_log entry makes the loser of a race retry on the next version, so
    every commit is in the table once (a blind overwrite of a version would lose the other's rows)."""
    sinks = [make_sink(azure_server, container, **{"sink.id": f"w{i}"}) for i in range(2)]
    coords = [coordinator(s, f"q{i}") for i, s in enumerate(sinks)]
    acks = {(i, cid): run_task(s, TransactionContext(s.sink_id, cid, "0"), [rows(cid, i)])
            for i, s in enumerate(sinks) for cid in range(6)}
    errors: list[BaseException] = []

    def drive(i: int) -> None:
        try:
            for cid in range(6):
                barrier.wait()
                assert coords[i].complete_batch(cid, [acks[(i, cid)]]) == "COMMITTED"
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()
    barrier = threading.Barrier(2, timeout=60)
    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = sorted(i for cid in range(6) for w in range(2) for i in rows(cid, w).column("id").to_pylist())
    assert table_ids(azure_server, sinks[0].uri) == want
    dt = DeltaTable(sinks[0].uri, storage_options=azure_server.storage_options())
    assert dt.version() == 12 and [dt.transaction_version(s.sink_id) for s in sinks] == [5, 5]


def test_delta_azure_sas_token_reaches_the_sdk_and_delta_rs(azure_server: AzureServer, container: str) -> None:
    """A container SAS token (no account key) writes, commits and reads back."""
    from datetime import datetime, timedelta, timezone
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    sas = generate_container_sas(azure_server.account, container, account_key=azure_server.key,
                                 permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True,
                                                                    add=True, create=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    opts = {"path": f"az://{container}/table", "azure.accountName": azure_server.account, "azure.sasToken": sas,
            "azure.endpoint": azure_server.endpoint}
    sink = DeltaSink.from_options(opts, SCHEMA)
    sink.validate_destination()
    assert "account_key" not in sink.options.storage_options() and sas not in repr(sink.options)
    coordinator(sink).complete_batch(0, [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])])
    assert table_ids(azure_server, sink.uri) == sorted(rows(0, 0).column("id").to_pylist())


@pytest.mark.parametrize("change, option", [
    ({"path": "abfss://no-such-container@devstoreaccount1.dfs.core.windows.net/t"}, "'path'"),
    ({"azure.accountKey": "d3Jvbmcta2V5LWJ1dC1iYXNlNjQ="}, "'azure.accountKey'"),
    ({"azure.endpoint": "http://127.0.0.1:9/devstoreaccount1"}, "'azure.endpoint'"),
])
def test_delta_azure_bad_options_are_configuration_errors_naming_the_option(azure_server: AzureServer,
                                                                           container: str, change, option) -> None:
    """Refused on the driver before any data moves, naming the option; the key never in the message."""
    opts = {"path": azure_server.url(container, "table"), **azure_server.options(), **change}
    with pytest.raises(ConfigurationError) as e:
        DeltaSink.from_options(opts, SCHEMA).validate_destination()
    assert option in str(e.value) and azure_server.key not in str(e.value)
    assert blobs(azure_server, container, uncommitted=True) == set()
