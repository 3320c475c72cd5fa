"""twophase-file on Azure Blob Storage (Azurite), driven without Spark: the Azure file sink's invariants
(``sinks/azure_files.py``): staged blocks invisible until the driver's Put Block List, a re-commit
ALREADY_COMMITTED, a blob of other content never overwritten, staged blocks gone = LOST, aborts and
sweeps that drop only this sink's staged blocks, a SIGKILLed driver recovered exactly once, and the
refusals of bad options."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from integration.azure.azurite import AzureServer, claimed_coordinator
from integration.azure.commit_job import SCHEMA, expected_ids, rows, run_clean_then_crash, run_commit_job, assert_done
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import CommitFailedError, ConfigurationError, DataLossError
from twophase.naming import part_file_name
from twophase.sink import CommitStatus, TransactionContext, run_task, sink_token
from twophase.sinks._azure import drop_uncommitted
from twophase.sinks.azure_files import AzureFilesSink
from twophase.sinks.files import file_sink_from_options
from twophase.states import CheckpointState

pytestmark = [pytest.mark.azure]



def options(server: AzureServer, container: str, **extra: str) -> dict[str, str]:
    return {"path": server.url(container, "out"), "partitionBy": "p", **server.options(), **extra}


def make_sink(server: AzureServer, container: str, **extra: str) -> AzureFilesSink:
    sink = file_sink_from_options(options(server, container, **extra), SCHEMA)
    assert isinstance(sink, AzureFilesSink)
    sink.validate_destination()
    return sink


coordinator = claimed_coordinator


def names(server: AzureServer, container: str, *, uncommitted: bool) -> set[str]:
    """Data blob names under 'out/' ('out/' stripped), with names that have only staged blocks if asked."""
    return {n for n in server.blob_names(container, "out", uncommitted=uncommitted)
            if n.rsplit("/", 1)[-1].startswith("part-")}


def read_ids(server: AzureServer, container: str) -> list[int]:
    """Every id in every committed data blob (what a reader of the path sees), sorted, duplicates kept."""
    c = server.service().get_container_client(container)
    out: list[int] = []
    for n in names(server, container, uncommitted=False):
        out += pq.read_table(io.BytesIO(c.get_blob_client(f"out/{n}").download_blob().readall())).column("id").to_pylist()
    return sorted(out)


def stage_only(sink: AzureFilesSink, cid: int, part_rel: str) -> str:
    """Stage blocks of a data file of ``sink``'s checkpoint ``cid`` (own name, a new attempt) and abandon them,
    as an attempt that died mid-write does; returns its name (relative to 'out/')."""
    from concurrent.futures import ThreadPoolExecutor
    name = part_file_name(sink.sink_id, cid, "0", uuid.uuid4().hex[:12], 0, "parquet")
    rel = f"{part_rel}/{name}" if part_rel else name
    with ThreadPoolExecutor(1) as pool:
        stream = sink.store.open_stream(sink.store.key(rel), pool)
        stream.write(b"x" * (100 << 10))
        stream.finish()
    return rel


def test_azure_files_sink_inv1_staged_blocks_unseen_until_the_drivers_commit_then_every_row(
        azure_server: AzureServer, container: str) -> None:
    """Two tasks stage their files (several 64 KiB blocks each): after prepare_commit no listing without
    uncommitted blobs shows a thing and no read finds a blob; the driver's commit shows every row once,
    each blob made of exactly the staged blocks."""
    sink = make_sink(azure_server, container, blockSize="64k")
    big = [pa.record_batch({"id": pa.array(range(c * 1000 + t * 100_000, c * 1000 + t * 100_000 + 30_000), pa.int64()),
                            "p": ["even"] * 30_000}, schema=SCHEMA) for c, t in ((0, 0), (0, 1))]
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [big[t]]) for t in range(2)]
    entries = [b for a in acks for b in a.handle["blobs"]]
    assert any(len(b["block_ids"]) > 1 for b in entries), "more than one block per file"
    assert names(azure_server, container, uncommitted=False) == set(), "staged blocks are visible"
    assert names(azure_server, container, uncommitted=True) == {b["name"][len("out/"):] for b in entries}
    assert coordinator(sink).complete_batch(0, acks) == "COMMITTED"
    assert read_ids(azure_server, container) == sorted(i for b in big for i in b.column("id").to_pylist())
    svc = azure_server.service()
    for b in entries:
        committed, staged = svc.get_blob_client(container, b["name"]).get_block_list("all")
        assert [x.id for x in committed] == b["block_ids"] and not staged
        assert sum(x.size for x in committed) == b["bytes"]


def test_azure_files_sink_inv2_a_second_commit_is_already_committed_and_writes_no_copy(
        azure_server: AzureServer, container: str) -> None:
    sink = make_sink(azure_server, container)
    coord = coordinator(sink)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows(0, t)]) for t in range(2)]
    assert coord.complete_batch(0, acks) == "COMMITTED"
    committer = sink.create_committer()
    results = committer.commit_checkpoint(0, [committer.decode(a.handle) for a in acks])
    assert {r.status for r in results} == {CommitStatus.ALREADY_COMMITTED}
    assert committer.commit(committer.decode(acks[0].handle)).status is CommitStatus.ALREADY_COMMITTED
    # a re-run of batch 0 (Spark after a restart): new attempt names, aborted, nothing new visible
    coord.complete_batch(0, [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])])
    assert read_ids(azure_server, container) == expected_ids(range(1)), "a re-commit wrote a second copy"
    assert names(azure_server, container, uncommitted=True) == names(azure_server, container, uncommitted=False)


def test_azure_files_sink_inv2_a_blob_of_other_content_under_the_name_is_never_overwritten(
        azure_server: AzureServer, container: str) -> None:
    """Another writer's blob under one of this checkpoint's names. Put before our blocks were staged (they
    are still there): an error naming the blob. Committed after (its Put Block List discards them): LOST
    naming it. The other blob is intact either way, and the coordinator stops with DataLossError."""
    sink = make_sink(azure_server, container)
    svc = azure_server.service()
    # 1) the other blob first, then our blocks staged under the same name: commit refuses, naming it
    w = sink.create_writer(TransactionContext(sink.sink_id, 0, "0"))
    name = sink.store.key(f"p=even/{part_file_name(sink.sink_id, 0, '0', w.context.attempt_uid, 0, 'parquet')}")
    svc.get_blob_client(container, name).upload_blob(b"someone else's bytes")
    w.write(rows(0, 0))
    handle = w.prepare_commit()
    assert [b["name"] for b in handle.blobs if b["name"] == name], "the writer used the name it was given"
    committer = sink.create_committer()
    with pytest.raises(CommitFailedError, match=name):
        committer.commit(handle)
    assert svc.get_blob_client(container, name).download_blob().readall() == b"someone else's bytes"
    # 2) our blocks staged, then another writer commits its own block list under the name (Put Block List
    # discards every staged block it does not list): LOST naming it
    from azure.storage.blob import BlobBlock
    ack = run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(1, 0)])
    other = ack.handle["blobs"][0]["name"]
    foreign = svc.get_blob_client(container, other)
    foreign.stage_block("ffffffff", b"other content")
    foreign.commit_block_list([BlobBlock(block_id="ffffffff")])
    result = committer.commit(committer.decode(ack.handle))
    assert result.status is CommitStatus.LOST and other in result.detail, result
    assert svc.get_blob_client(container, other).download_blob().readall() == b"other content"
    log = sink.transaction_log()
    log.claim("t")
    with pytest.raises(DataLossError):
        CheckpointCoordinator(sink, log).complete_batch(1, [ack])
    assert svc.get_blob_client(container, other).download_blob().readall() == b"other content"


def test_azure_files_sink_inv2_staged_blocks_gone_is_lost_naming_the_file(azure_server: AzureServer,
                                                                        container: str) -> None:
    """Staged blocks dropped before the commit (Azure drops uncommitted blocks after seven days): LOST with
    the file's name, and the coordinator stops with DataLossError; never a silent skip."""
    sink = make_sink(azure_server, container)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])
    gone = ack.handle["blobs"][0]["name"]
    assert drop_uncommitted(azure_server.service().get_blob_client(container, gone))
    result = sink.create_committer().commit(sink.create_committer().decode(ack.handle))
    assert result.status is CommitStatus.LOST and gone in result.detail and "seven days" in result.detail
    with pytest.raises(DataLossError, match="lost"):
        coordinator(sink).complete_batch(0, [ack])
    assert gone[len("out/"):] not in names(azure_server, container, uncommitted=True)


def test_azure_files_sink_inv3_abort_drops_staged_blocks_and_never_a_committed_blob(azure_server: AzureServer,
                                                                                  container: str) -> None:
    sink = make_sink(azure_server, container)
    committer = sink.create_committer()
    aborted = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])
    committed = run_task(sink, TransactionContext(sink.sink_id, 0, "1"), [rows(0, 1)])
    committer.commit(committer.decode(committed.handle))
    committer.abort(committer.decode(aborted.handle))
    committer.abort(committer.decode(aborted.handle))  # idempotent
    committer.abort(committer.decode(committed.handle))  # a committed blob: untouched
    assert names(azure_server, container, uncommitted=True) == {b["name"][len("out/"):] for b in committed.handle["blobs"]}
    assert read_ids(azure_server, container) == sorted(rows(0, 1).column("id").to_pylist())


def test_azure_files_sink_inv4_sweep_drops_own_losers_staged_blocks_never_another_sinks_or_a_committed_blob(
        azure_server: AzureServer, container: str) -> None:
    """Checkpoint 1 of sink A: one attempt died with blocks staged, one pre-committed but its ack was lost, the
    third won; a staged attempt of A's checkpoint 2 is in flight. Sink B (another sink.id: another token)
    shares the path with a pre-committed file and staged blocks of its own. Right after A's commit (its sweep,
    with the commit): A's losers of checkpoints <= 1 are gone, A's committed blobs and checkpoint 2's staged
    blocks and every name of B are there; B then commits its file. Committing A's checkpoint 1 again after the
    sweep is ALREADY_COMMITTED (sweep_with_commit), and the record says it was swept."""
    a = make_sink(azure_server, container, **{"sink.id": "a"})
    b = make_sink(azure_server, container, **{"sink.id": "b"})
    assert sink_token(a.sink_id) != sink_token(b.sink_id)
    coord_a, coord_b = coordinator(a, "qa"), coordinator(b, "qb")
    coord_a.complete_batch(0, [run_task(a, TransactionContext(a.sink_id, 0, "0"), [rows(0, 0)])])
    crashed = stage_only(a, 1, "p=even")
    lost = run_task(a, TransactionContext(a.sink_id, 1, "0"), [rows(1, 0)])
    won = run_task(a, TransactionContext(a.sink_id, 1, "0"), [rows(1, 0)])
    later = stage_only(a, 2, "p=odd")
    b_ack = run_task(b, TransactionContext(b.sink_id, 1, "0"), [rows(1, 1)])
    b_staged = stage_only(b, 1, "")
    committed_before = names(azure_server, container, uncommitted=False)
    before = names(azure_server, container, uncommitted=True)
    assert crashed in before and later in before and b_staged in before
    assert coord_a.complete_batch(1, [won]) == "COMMITTED"
    after = names(azure_server, container, uncommitted=True)
    assert crashed not in after and not {x["name"][len("out/"):] for x in lost.handle["blobs"]} & after
    assert later in after, "a later checkpoint's staged blocks were swept"
    assert {n for n in before if sink_token(b.sink_id) in n} <= after, "another sink's staged blocks were swept"
    assert committed_before <= names(azure_server, container, uncommitted=False), "a committed blob was swept"
    rec = a.transaction_log().get(1)
    assert rec.state is CheckpointState.COMMITTED and rec.swept
    committer = a.create_committer()
    assert committer.commit(committer.decode(won.handle)).status is CommitStatus.ALREADY_COMMITTED
    assert coord_b.complete_batch(1, [b_ack]) == "COMMITTED"
    assert b_staged not in names(azure_server, container, uncommitted=True), "B's own sweep left its staged blocks"
    assert read_ids(azure_server, container) == sorted([*rows(0, 0).column("id").to_pylist(),
                                                        *rows(1, 0).column("id").to_pylist(),
                                                        *rows(1, 1).column("id").to_pylist()])


def test_azure_files_sink_inv5_a_checkpoints_files_are_committed_at_once(azure_server: AzureServer,
                                                                          container: str) -> None:
    """Four tasks, eight files: each Put Block List waits at a barrier of eight before it is sent, so a commit
    that committed them one after another would break the barrier (and fail) instead of passing."""
    import threading
    sink = make_sink(azure_server, container)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, str(t)), [rows(0, t)]) for t in range(4)]
    files = sum(len(a.handle["blobs"]) for a in acks)
    assert files == 8
    barrier = threading.Barrier(files, timeout=30)

    def at_once(request: Any) -> None:
        r = request.http_request
        if r.method == "PUT" and "comp=blocklist" in r.url:
            barrier.wait()

    sink.store._client = sink.options.azure.container_client(sink.options.container, raw_request_hook=at_once)
    assert coordinator(sink).complete_batch(0, acks) == "COMMITTED"
    assert read_ids(azure_server, container) == sorted(i for t in range(4) for i in rows(0, t).column("id").to_pylist())


@pytest.mark.parametrize("point", ["after_complete", "mid_commit"])
def test_azure_files_sink_inv2_crash_between_completed_and_commit_recovers_exactly_once(
        azure_server: AzureServer, container: str, tmp_path: Path, point: str) -> None:
    """The driver is SIGKILLed after checkpoint 1 is COMPLETED (after_complete: before any Put Block List;
    mid_commit: after the first). The next run recovers it, re-runs batch 1 (as Spark does after a restart)
    and writes batch 2: every row once, no staged-only name left, every log record final."""
    opts = options(azure_server, container)

    run_clean_then_crash(opts, tmp_path, point, "file")
    got = read_ids(azure_server, container)
    assert set(got) <= set(expected_ids(range(2))) and len(got) == len(set(got))
    if point == "after_complete":  # nothing of checkpoint 1 visible, all of it staged
        assert got == expected_ids(range(1))
        assert names(azure_server, container, uncommitted=True) - names(azure_server, container, uncommitted=False)
    else:  # the first Put Block List went through (the others maybe)
        assert len(got) > len(expected_ids(range(1)))
    for cid in (1, 2):
        assert_done(run_commit_job(opts, cid, "file"))
    assert read_ids(azure_server, container) == expected_ids(range(3))
    assert names(azure_server, container, uncommitted=True) == names(azure_server, container, uncommitted=False), \
        "staged blocks left"
    sink = file_sink_from_options(opts, SCHEMA)
    states = {r.state for r in sink.transaction_log().records()}
    assert states <= {CheckpointState.COMMITTED, CheckpointState.ABORTED}, states


def test_azure_files_sink_the_log_lives_beside_the_data_in_the_container(azure_server: AzureServer,
                                                                         container: str) -> None:
    sink = make_sink(azure_server, container)
    coordinator(sink).complete_batch(0, [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [rows(0, 0)])])
    c = azure_server.service().get_container_client(container)
    logs = [x.name for x in c.list_blobs(name_starts_with=f"out/_twophase/{sink_token(sink.sink_id)}/log/")]
    assert logs and sink.transaction_log().location.startswith("abfss://")


@pytest.mark.parametrize("change, option", [
    ({"path": "abfss://no-such-container@devstoreaccount1.dfs.core.windows.net/out"}, "'path'"),
    ({"azure.accountKey": "d3Jvbmcta2V5LWJ1dC1iYXNlNjQ="}, "'azure.accountKey'"),
    ({"azure.endpoint": "http://127.0.0.1:9/devstoreaccount1"}, "'azure.endpoint'"),
])
def test_azure_files_bad_destination_is_a_configuration_error_naming_the_option(azure_server: AzureServer,
                                                                                container: str, change, option) -> None:
    opts = {**options(azure_server, container), **change}
    with pytest.raises(ConfigurationError) as e:
        file_sink_from_options(opts, SCHEMA).validate_destination()
    assert option in str(e.value) and azure_server.key not in str(e.value)
    assert names(azure_server, container, uncommitted=True) == set()


@pytest.mark.parametrize("nested, outer_partition_by", [("eu", "p"), ("region=eu", "p"), ("region=eu", "")])
def test_azure_files_sink_inv4_a_nested_destination_with_the_same_sink_id_is_never_swept(
        azure_server: AzureServer, container: str, nested: str, outer_partition_by: str, monkeypatch) -> None:
    """Two destinations, one inside the other (.../out and .../out/<nested>), given the same explicit sink.id:
    their names carry the same token and each has its own log. A's sweep lists out/, which holds B's staged
    blocks too; it takes only names where A puts its files (directly under out/, or under the folders of A's own
    partition columns), so B's pre-committed file survives and B commits it. ``region=eu`` is the
    one-job-per-partition layout: it looks like a Hive partition folder, but ``region`` is not A's partition
    column (A is partitioned by ``p``, or not at all). A's own crashed attempt (a runtime task id,
    ``<uid>-<subtask>``) is still swept. Every sweep here lists the whole path (FULL_SWEEP_EVERY = 1), the
    listing that reaches the nested destination (a scoped one lists only A's checkpoint's own names)."""
    from concurrent.futures import ThreadPoolExecutor
    from twophase.sinks.azure_files import AzureBlobs
    monkeypatch.setattr(AzureBlobs, "FULL_SWEEP_EVERY", 1)
    a = make_sink(azure_server, container, **{"sink.id": "same", "partitionBy": outer_partition_by})
    b = file_sink_from_options({"path": azure_server.url(container, f"out/{nested}"), **azure_server.options(),
                                "sink.id": "same"}, SCHEMA)
    assert isinstance(b, AzureFilesSink) and sink_token(a.sink_id) == sink_token(b.sink_id)
    coord_a, coord_b = coordinator(a, "qa"), coordinator(b, "qb")  # two logs: no refusal
    b_ack = run_task(b, TransactionContext(b.sink_id, 1, "0"), [rows(1, 1)])  # pre-committed, not committed yet
    name = part_file_name(a.sink_id, 1, "out-0", uuid.uuid4().hex[:12], 0, "parquet")
    crashed = f"p=even/{name}" if outer_partition_by else name
    with ThreadPoolExecutor(1) as pool:  # the embedded runtime's task died with blocks staged
        stream = a.store.open_stream(a.store.key(crashed), pool)
        stream.write(b"x" * 1000)
        stream.finish()
    assert crashed in names(azure_server, container, uncommitted=True)
    assert coord_a.complete_batch(2, [run_task(a, TransactionContext(a.sink_id, 2, "0"), [rows(2, 0)])]) == "COMMITTED"
    after = names(azure_server, container, uncommitted=True)
    assert crashed not in after, "A's own crashed attempt was not swept"
    assert {x["name"][len("out/"):] for x in b_ack.handle["blobs"]} <= after, "A swept the nested destination's file"
    assert coord_b.complete_batch(1, [b_ack]) == "COMMITTED"


def test_azure_files_sink_inv3_an_abort_cut_between_its_two_requests_leaves_no_empty_blob(
        azure_server: AzureServer, container: str) -> None:
    """Dropping staged blocks is two requests (an empty Put Block List, then Delete Blob by its ETag). Cut
    between them (a crash; or the SDK re-sent the Put Block List whose first answer was lost and got 409),
    a committed 0-byte blob is left under the sink's name, which readers of the path fail on. A data file of
    the sink is never 0 bytes (every format writes at least one byte per row, and a file has a row), so such
    a blob is provably an abort's leftover: the retried drop removes it, and so does the next sweep."""
    import pyarrow as _pa
    from twophase.sinks._formats import COMPRESSIONS, FORMATS, open_format_writer
    from azure.core import MatchConditions
    for fmt in FORMATS:  # the premise: one row of the emptiest value is never 0 bytes, in any format
        for comp in COMPRESSIONS[fmt]:
            for value in (None, ""):
                buf = io.BytesIO()
                w = open_format_writer(fmt, buf, _pa.schema([("v", _pa.string())]), compression=comp)
                w.write(_pa.record_batch({"v": _pa.array([value], _pa.string())}))
                w.close()
                assert buf.getvalue(), (fmt, comp, value)
    sink = make_sink(azure_server, container)
    svc = azure_server.service()

    def cut_drop(rel: str) -> None:  # the first of the two requests, alone
        svc.get_blob_client(container, f"out/{rel}").commit_block_list([], match_condition=MatchConditions.IfMissing)

    retried = stage_only(sink, 1, "p=even")
    cut_drop(retried)  # the first Put Block List's answer was lost: its retry gets 409 BlobAlreadyExists
    assert retried in names(azure_server, container, uncommitted=False)
    assert drop_uncommitted(svc.get_blob_client(container, f"out/{retried}"))
    assert retried not in names(azure_server, container, uncommitted=True), "the retried drop left an empty blob"
    crashed = stage_only(sink, 1, "p=odd")
    cut_drop(crashed)  # the process died between the two requests
    other = make_sink(azure_server, container, **{"sink.id": "other"})
    foreign = stage_only(other, 1, "")
    svc.get_blob_client(container, f"out/{foreign}").commit_block_list([])  # another sink's empty blob
    assert coordinator(sink).complete_batch(1, [run_task(sink, TransactionContext(sink.sink_id, 1, "0"),
                                                         [rows(1, 0)])]) == "COMMITTED"
    left = names(azure_server, container, uncommitted=True)
    assert crashed not in left, "the sweep left an abort's empty blob"
    assert foreign in left, "the sweep removed another sink's blob"
    svc.get_blob_client(container, f"out/{foreign}").delete_blob()
    assert read_ids(azure_server, container) == sorted(rows(1, 0).column("id").to_pylist())


class _CountingContainer:
    """The sink's container client, counting the names its List Blobs calls return (what a listing reads)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.listed = inner, 0

    def list_blobs(self, *args: Any, **kwargs: Any) -> Any:
        for b in self.inner.list_blobs(*args, **kwargs):
            self.listed += 1
            yield b

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def old_files(server: AzureServer, container: str, sink: AzureFilesSink, n: int, first_cid: int) -> None:
    """``n`` committed 1-byte blobs with the sink's own names (checkpoints from ``first_cid``, both partition
    folders): what months of earlier batches left under the path, made cheaply (a data file is never 0 bytes,
    so the sweep must treat them as data)."""
    from concurrent.futures import ThreadPoolExecutor
    c = server.service().get_container_client(container)

    def put(i: int) -> None:
        name = part_file_name(sink.sink_id, first_cid + i // 10, str(i % 10), uuid.uuid4().hex[:12], 0, "parquet")
        c.upload_blob(f"out/p={'even' if i % 2 else 'odd'}/{name}", b"x")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(n)))


def test_azure_files_sink_inv6_a_batchs_sweep_lists_no_more_as_old_files_grow(azure_server: AzureServer,
                                                                              container: str) -> None:
    """The sweep right after a batch's commit lists what that batch can have touched, not the path: its
    listings return at most the batch's own files (twice), with 0 and with 400 old committed files of the sink
    under the path (the whole-path listing of every batch returned every one of them, twice). The old files
    are all still there."""
    sink = make_sink(azure_server, container)
    coord = coordinator(sink)
    counting = _CountingContainer(sink.store.client)
    sink.store._client = counting
    coord.complete_batch(1, [run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(1, 0)])])

    def listed_by_batch(cid: int) -> int:
        """Names the batch's sweep listed, at most its own files twice (the listing runs beside the commits:
        a file is listed by the first listing, the second, or both, as the race goes)."""
        ack = run_task(sink, TransactionContext(sink.sink_id, cid, "0"), [rows(cid, 0)])
        before = counting.listed
        assert coord.complete_batch(cid, [ack]) == "COMMITTED"
        listed = counting.listed - before
        assert listed <= 2 * len(ack.handle["blobs"]), f"batch {cid}'s sweep listed {listed} names"
        return listed

    listed_by_batch(2)
    old_files(azure_server, container, sink, 400, 1000)
    committed = names(azure_server, container, uncommitted=False)
    listed_by_batch(3)
    assert committed <= names(azure_server, container, uncommitted=False), "an old data file was swept"


def test_azure_files_sink_inv6_a_straggler_the_scoped_sweep_cannot_see_goes_at_the_next_whole_listing(
        azure_server: AzureServer, container: str, monkeypatch) -> None:
    """Invariant 6, the case a scoped listing cannot cover: a zombie attempt of checkpoint 1 stages blocks
    AFTER checkpoint 1's sweep, under a partition folder no batch of this run wrote (p=zombie); and a
    straggler of checkpoint 2 in a folder checkpoint 2 wrote is dropped at once by 2's scoped sweep. With
    FULL_SWEEP_EVERY = 4, the zombie survives the scoped sweeps of 2 and 3 (it is invisible: staged blocks
    only) and is gone after checkpoint 4's sweep, the whole listing; nothing committed is touched."""
    from twophase.sinks.azure_files import AzureBlobs
    monkeypatch.setattr(AzureBlobs, "FULL_SWEEP_EVERY", 4)
    sink = make_sink(azure_server, container)
    coord = coordinator(sink)
    assert coord.complete_batch(1, [run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(1, 0)])]) == "COMMITTED"
    zombie = stage_only(sink, 1, "p=zombie")
    loser = stage_only(sink, 2, "p=even")
    ack2 = run_task(sink, TransactionContext(sink.sink_id, 2, "0"), [rows(2, 0)])
    assert coord.complete_batch(2, [ack2]) == "COMMITTED"
    left = names(azure_server, container, uncommitted=True)
    assert loser not in left, "the scoped sweep missed a loser of its own checkpoint in a folder it wrote"
    assert zombie in left
    assert coord.complete_batch(3, [run_task(sink, TransactionContext(sink.sink_id, 3, "0"), [rows(3, 0)])]) == "COMMITTED"
    assert zombie in names(azure_server, container, uncommitted=True)
    assert coord.complete_batch(4, [run_task(sink, TransactionContext(sink.sink_id, 4, "0"), [rows(4, 0)])]) == "COMMITTED"
    assert zombie not in names(azure_server, container, uncommitted=True), "the whole listing missed the zombie"
    assert read_ids(azure_server, container) == sorted(i for c in (1, 2, 3, 4) for i in rows(c, 0).column("id").to_pylist())


def test_azure_files_sink_inv6_a_batch_without_rows_lists_no_more_as_old_files_grow(azure_server: AzureServer,
                                                                                   container: str) -> None:
    """A batch whose tasks wrote no file (a stateful query's no-data batch) is committed and swept too: its sweep
    lists what it can have touched (its names directly under the path), not the 400 old files of the sink
    (with no file to complete, the sweep listed the whole path, twice)."""
    sink = make_sink(azure_server, container)
    coord = coordinator(sink)
    counting = _CountingContainer(sink.store.client)
    sink.store._client = counting
    coord.complete_batch(1, [run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [rows(1, 0)])])
    old_files(azure_server, container, sink, 400, 1000)
    committed = names(azure_server, container, uncommitted=False)
    ack = run_task(sink, TransactionContext(sink.sink_id, 2, "0"), [])
    assert not ack.handle["blobs"]
    before = counting.listed
    assert coord.complete_batch(2, [ack]) == "COMMITTED"
    assert counting.listed - before == 0, f"an empty batch's sweep listed {counting.listed - before} names"
    assert committed <= names(azure_server, container, uncommitted=False)
